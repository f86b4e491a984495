"""Checkpoints in Hugging Face layout, written atomically, found again on resume.

runs/<name>/checkpoints/step-000020/
  model.safetensors | adapter_model.safetensors, config.json, tokenizer files   (from_pretrained works)
  train_config.yaml         (the run's resolved config)
  trainer_state.pt          (optimizer, scheduler, RNG, step, stage, data position)
  ewc.safetensors           (accumulated Fisher and anchors, once a stage has ended with ewc_lambda > 0)
  STAGE_END                 (the stage's name, in the checkpoint that ends a curriculum stage; kept forever)
  SAMPLED_SIGNAL            (these weights sampled a step that taught something: written at that next step)
A checkpoint is written to a hidden temporary directory and renamed when complete, so a crash mid-save
never leaves something that looks complete. Directories starting with '.' are ignored by `latest`.
torch is imported where it is used, so that the web app lists checkpoints without loading it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config as config_mod
from ..errors import UserError

if TYPE_CHECKING:
    import torch

STATE_FILE = "trainer_state.pt"
STAGE_FILE = "STAGE_END"
GOOD_FILE = "SAMPLED_SIGNAL"
_NAME = re.compile(r"^step-(\d+)$")


def save(run_dir: Path, step: int, model, tokenizer, cfg, state: dict, keep: int = 2, tag: str = "",
         extra=None) -> Path:
    """Write checkpoint step-NNNNNN (complete or not at all); keep the newest `keep` checkpoints.

    A checkpoint with a `tag` (the end of a curriculum stage) gets a STAGE_END file naming it and is never
    removed by the rotation, and neither is the newest checkpoint whose weights sampled a step that taught something
    (`mark_good`), so that a run that collapses (a learning rate that wrecks the model: reward 0 everywhere) never
    rotates its last good weights away. `extra(dir)` writes more files into the checkpoint before it is complete.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        config_mod.save(cfg, tmp / "train_config.yaml")
        if extra is not None:
            extra(tmp)
        if tag:
            (tmp / STAGE_FILE).write_text(tag + "\n")
        import torch

        torch.save({**state, "step": step, "tag": tag}, tmp / STATE_FILE)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    done = complete(root)
    kept = {*done[-keep:], *[c for c in done if (c / STAGE_FILE).exists()], *last_good(done)}
    for old in [c for c in done if c not in kept]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def mark_good(run_dir: Path, step: int) -> None:
    """The rollouts of step `step` + 1, sampled from the weights of step `step`, taught something (some group's
    rewards differed): its checkpoint, if it has one, is known good. The checkpoint saved after a step holds the
    weights that step's update made, which only the next step's rollouts can judge."""
    ckpt = Path(run_dir) / "checkpoints" / f"step-{step:06d}"
    if (ckpt / STATE_FILE).exists():
        (ckpt / GOOD_FILE).write_text(f"the rollouts of step {step + 1}, sampled from these weights, taught "
                                      "something\n")


def last_good(checkpoints: list[Path]) -> list[Path]:
    """The newest of these checkpoints whose weights sampled a step that taught something (none, or one, in a
    list)."""
    return [c for c in checkpoints if (c / GOOD_FILE).exists()][-1:]


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name) and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def remove_partial(run_dir: Path) -> int:
    """Remove the hidden temporary directories of checkpoints whose writing was killed; returns how many."""
    root = Path(run_dir) / "checkpoints"
    partial = [p for p in root.glob(".step-*") if p.is_dir()] if root.is_dir() else []
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return len(partial)


def latest(run_dir: Path) -> Path | None:
    found = complete(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def problem(ckpt: Path) -> str | None:
    """Why a complete-looking checkpoint cannot be resumed from (a file missing or unreadable), or None."""
    from safetensors import safe_open

    weights = sorted(ckpt.glob("model*.safetensors")) + sorted(ckpt.glob("adapter_model.safetensors"))
    if not weights:
        return "it has no model.safetensors or adapter_model.safetensors"
    for f in weights:
        try:
            with safe_open(str(f), "pt") as st:  # reads the header; a cut-off file fails on its last tensor
                names = list(st.keys())
                if names:
                    st.get_tensor(names[-1])
        except Exception as e:
            return f"{f.name} is unreadable ({type(e).__name__})"
    try:
        load_state(ckpt)
    except Exception as e:
        return f"{STATE_FILE} is unreadable ({type(e).__name__})"
    return None


def latest_good(run_dir: Path, log=print) -> Path | None:
    """The newest checkpoint that loads; each newer one that does not is named, with what is wrong with it."""
    for ckpt in reversed(complete(Path(run_dir) / "checkpoints")):
        why = problem(ckpt)
        if why is None:
            return ckpt
        log(f"warning: skipping checkpoint {ckpt.name}: {why}; trying an older one")
    return None


def load_state(ckpt: Path) -> dict:
    import torch

    return torch.load(ckpt / STATE_FILE, weights_only=False)


def rng_state(generator: torch.Generator) -> dict:
    import torch

    return {"torch": torch.get_rng_state(), "sampler": generator.get_state()}


def restore_rng(state: dict, generator: torch.Generator) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])


def load_weights(model, ckpt: Path):
    """Load a checkpoint's trained weights (full model or LoRA adapter) into an already built model."""
    from safetensors.torch import load_file

    adapter = Path(ckpt) / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(adapter))
        return model
    state = {}
    for f in sorted(Path(ckpt).glob("model*.safetensors")):  # not ewc.safetensors
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise UserError(f"checkpoint {ckpt} does not fit this model (missing {list(missing)[:3]}, unexpected "
                         f"{list(unexpected)[:3]}): resume with the same --model as the run.")
    return model
