"""What an export starts from: a run or one of its checkpoints, the config it trained with, the model loaded.

A run directory means its newest checkpoint that loads (train.checkpoint.latest_good); a checkpoint directory
(runs/<name>/checkpoints/step-NNNNNN) means itself. The run's train_config.yaml, saved in every checkpoint, holds
the instruction appended to each math question (example.Example.chat): the prompt shape the model learned.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .. import config as config_mod
from ..errors import UserError
from ..train import checkpoint


@dataclass(frozen=True)
class Source:
    checkpoint: Path
    run_dir: Path | None  # None for a checkpoint copied out of its run
    cfg: dict  # the checkpoint's train_config.yaml

    @property
    def lora(self) -> bool:
        return (self.checkpoint / "adapter_config.json").exists()

    @functools.cached_property
    def instruction(self) -> str:
        """The instruction the run appended to each question: to math problems only (example.Example.chat), so that a
        run of another task (code, countdown, your own rows judged by a reward) asked without it, and so does its
        export."""
        text = str(self.cfg.get("instruction", config_mod.TrainConfig.instruction))
        return text if text and any(ex.math for ex in held_out(self, 4)) else ""

    @property
    def fields(self) -> dict:
        """The run's config fields, but where it wrote (an export builds configs from them, writing nowhere)."""
        return {k: v for k, v in self.cfg.items() if k != "output_dir"}

    @functools.cached_property
    def system(self) -> str:
        """The system prompt the run put first: config field system_prompt, else the one every held-out row of its
        own carries (chat rows with a system turn), else ""."""
        if self.cfg.get("system_prompt"):
            return str(self.cfg["system_prompt"])
        firsts = {ex.messages[0].get("content") if ex.messages and ex.messages[0].get("role") == "system" else None
                  for ex in held_out(self, 20)}
        return firsts.pop() or "" if len(firsts) == 1 else ""

    @functools.cached_property
    def example(self) -> str | None:
        """A held-out question of the run's own task (its last user turn), None for a math run (asked EXAMPLE)."""
        rows = held_out(self, 1)
        if not rows or rows[0].math:
            return None
        users = [m["content"] for m in rows[0].messages if m.get("role") == "user"]
        return users[-1] if users else rows[0].question

    @property
    def step(self) -> int:
        return int(self.checkpoint.name.split("-")[-1]) if self.checkpoint.name.startswith("step-") else 0

    def adapter_base(self) -> str:
        """The base model a LoRA checkpoint's adapter was trained on, as the checkpoint names it."""
        return json.loads((self.checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"]


def find(spec: str | Path, log=print) -> Source:
    """The checkpoint `spec` names (a run directory: its newest good checkpoint), with its saved config."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UserError(f"{spec} is not a directory: give a run directory (runs/<name>) or one of its checkpoints "
                        "(runs/<name>/checkpoints/step-NNNNNN).")
    if (path / "train_config.yaml").exists() and path.parent.name == "checkpoints":
        ckpt, run_dir = path, path.parent.parent
    elif (path / "checkpoints").is_dir() or (path / "train_config.yaml").exists():
        ckpt, run_dir = checkpoint.latest_good(path, log), path
        if ckpt is None:
            raise UserError(f"the run {path} has no complete checkpoint yet: let it train until it saves one "
                            "(every save_every steps, and at the end), or resume it with `cpu-grpo train "
                            f"--output-dir {path} --resume`, then export again.")
    else:
        raise UserError(f"{spec} is neither a run directory nor a checkpoint (no train_config.yaml): give runs/<name> "
                        "or runs/<name>/checkpoints/step-NNNNNN.")
    cfg_file = ckpt / "train_config.yaml"
    if not cfg_file.exists():
        raise UserError(f"checkpoint {ckpt} has no train_config.yaml: it was not written by cpu-grpo train; export "
                        "a checkpoint of a cpu-grpo run.")
    if not any(ckpt.glob("*.safetensors")):
        raise UserError(f"checkpoint {ckpt} has no weights (model.safetensors or adapter_model.safetensors): it is "
                        "incomplete; export an older checkpoint of the run.")
    return Source(ckpt, run_dir if run_dir.is_dir() else None, config_mod.load_file(cfg_file))


def load(src: Source, log=print):
    """(model, tokenizer) of the checkpoint in fp32, a LoRA adapter merged into its base: a plain transformers
    model, as `export` writes it."""
    import torch

    from ..engine.models import load_model

    model, tok = load_model(str(src.checkpoint), bool(src.cfg.get("trust_remote_code")), log=log,
                            dtype=torch.float32)
    model.eval()
    return model, tok


def held_out(src: Source, n: int) -> list:
    """n problems from the test split of the run's held-out sets (seed + 1, as the run draws them: its own held-out
    problems first, then more of the same split, none ever trained on), in equal shares of its sets."""
    from ..train import curriculum

    sets = curriculum.held_out(config_mod.build(None, None, {**src.fields, "eval_size": max(1, n)}))
    share = -(-n // max(1, len(sets)))
    return [ex for s in sets for ex in s.examples[:share]][:n]


def judge(src: Source, max_new_tokens: int):
    """What "correct" means for the run's held-out problems, as its evaluation decides it (eval.evaluate.Judge)."""
    from ..eval.evaluate import Judge

    cfg = config_mod.build(None, None, src.fields)
    return Judge.of(cfg.rewards, cfg.correct_reward, max_new_tokens, cfg.reward_timeout)


def before_after(src: Source) -> str:
    """The run's before/after accuracy table (its summary.json), or a sentence saying there is none."""
    from ..eval.tables import accuracy_table
    from ..rundir import read_json

    summary = read_json(src.run_dir / "summary.json") if src.run_dir else None
    if not summary or not summary.get("levels"):
        return "The run has no summary.json with a before/after evaluation (it has not finished, or eval_size was 0)."
    return accuracy_table(summary["levels"])


def base_name(src: Source) -> str:
    """How an exported adapter names its base: the hub id of an alias (what others have), else as the run did."""
    from ..engine.models import ALIASES

    model = str(src.cfg.get("model", ""))
    return ALIASES[model].hub_id if model in ALIASES else src.adapter_base()
