"""A run's progress: what a checkpoint saves of it, and what one saved before Progress existed gives back."""

from __future__ import annotations

import json
from dataclasses import asdict

from cpu_grpo.train.runstate import Progress


def test_progress_comes_back_as_it_was_saved(tmp_path):
    p = Progress(step=7, stage_index=1, stage_step=3, data_pos=12, type_counts={"t": [8, 2]}, validation=0.5,
                 stage_ended=True, bad_steps=1, all_equal_steps=2, micro_cap=4)
    assert Progress.restored({"step": 7, "tag": "", "progress": asdict(p)}, tmp_path) == p


def test_a_checkpoint_saved_before_progress_resumes_from_its_own_keys(tmp_path):
    old = {"step": 5, "tag": "", "data_pos": 6, "stage_index": 1, "stage_step": 2, "all_equal_steps": 3,
           "type_counts": {"t": [4, 1]}}
    assert Progress.restored(old, tmp_path) == Progress(5, 1, 2, 6, {"t": [4, 1]}, all_equal_steps=3)
    assert Progress.restored({"step": 4, "data_pos": 8}, tmp_path) == Progress(4, 0, 4, 8)  # before stages
    # a stage's end checkpoint (tagged): ended, with the validation accuracy its stages.jsonl record holds
    (tmp_path / "stages.jsonl").write_text(json.dumps({"stage": "basic", "stage_index": 0, "end_step": 2,
                                                       "promoted": True, "validation_accuracy": 0.75}) + "\n")
    end = {"step": 2, "tag": "basic", "data_pos": 4, "stage_index": 0, "stage_step": 2}
    assert Progress.restored(end, tmp_path) == Progress(2, 0, 2, 4, validation=0.75, stage_ended=True)
    assert Progress.restored({**end, "tag": ""}, tmp_path) == Progress(2, 0, 2, 4)  # saved later in the same step
