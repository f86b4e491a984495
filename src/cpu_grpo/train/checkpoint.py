"""Checkpoints in Hugging Face layout, written atomically, found again on resume.

runs/<name>/checkpoints/step-000020/
  model.safetensors | adapter_model.safetensors, config.json, tokenizer files   (from_pretrained works)
  train_config.yaml         (the run's resolved config)
  trainer_state.pt          (optimizer, scheduler, RNG, the run's progress: step, stage, data position, ...)
  ewc.safetensors           (accumulated Fisher and anchors, once a stage has ended with ewc_lambda > 0)
  STAGE_END                 (the stage's name, in the checkpoint that ends a curriculum stage; kept forever)
  SAMPLED_SIGNAL            (these weights sampled a step that taught something: written at that next step)
A checkpoint is written to a hidden temporary directory and renamed when complete, so a crash mid-save
never leaves something that looks complete. Directories starting with '.' are ignored by `latest`.
torch is imported where it is used, so that the web app lists checkpoints without loading it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config as config_mod
from ..errors import RunDirError, UserError

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
    A directory that cannot be written (read-only, no permission) is one sentence (`unwritable`); the older
    checkpoints stay.
    """
    try:
        return _save(run_dir, step, model, tokenizer, cfg, state, keep, tag, extra)
    except OSError as e:
        failure = unwritable(e, run_dir, f"the checkpoint of step {step} could not be saved")
        if failure is None:
            raise
        raise failure from None


def _save(run_dir: Path, step: int, model, tokenizer, cfg, state: dict, keep: int, tag: str, extra) -> Path:
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
    if (ckpt / STATE_FILE).exists() and not (ckpt / GOOD_FILE).exists():
        try:
            (ckpt / GOOD_FILE).write_text(f"the rollouts of step {step + 1}, sampled from these weights, taught "
                                          "something\n")
        except OSError as e:
            failure = unwritable(e, run_dir, f"checkpoint {ckpt.name} could not be marked good")
            if failure is None:
                raise
            raise failure from None


# errors of a directory this process may not write, as the sentences name them (loop._plainly says them too)
NOT_WRITABLE = {errno.EROFS: "read-only", errno.EACCES: "not writable by this user",
                 errno.EPERM: "not writable by this user"}


def unwritable(e: OSError, run_dir: Path, what: str) -> RunDirError | None:
    """A checkpoint directory that cannot be written (a read-only mount, no permission) as one sentence naming it
    and the way on; None for any other error (a full disk: runstate.save_checkpoint says it)."""
    if e.errno not in NOT_WRITABLE:
        return None
    root = Path(run_dir) / "checkpoints"
    where = root if root.is_dir() else Path(run_dir)
    last = latest(run_dir)
    return RunDirError(f"{where} is {NOT_WRITABLE[e.errno]} ({os.strerror(e.errno)}): {what}; make it writable "
                       f"(remount it read-write, or give this user write permission) and continue with --resume "
                       f"(from {last.name if last else 'the start'}); the checkpoints already there are kept")


def last_good(checkpoints: list[Path]) -> list[Path]:
    """The newest of these checkpoints whose weights sampled a step that taught something (none, or one, in a
    list)."""
    return [c for c in checkpoints if (c / GOOD_FILE).exists()][-1:]


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under root, oldest first."""
    return [p for p in candidates(root) if (p / STATE_FILE).exists()]


def candidates(root: Path) -> list[Path]:
    """The directories under root named as checkpoints (step-NNNNNN), complete or not, oldest first: a save only
    ever renames a complete one into place, so one without trainer_state.pt was changed by hand."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
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
    """Why a checkpoint cannot be resumed from (a file missing, unreadable or cut short, a tensor of another shape
    than its config.json makes), or None."""
    from safetensors import safe_open

    from ..engine.models import damaged_safetensors, wrong_shape

    if not (ckpt / STATE_FILE).exists():
        return f"it has no {STATE_FILE} (the optimizer, the step and the data position)"
    weights = sorted(ckpt.glob("model*.safetensors")) + sorted(ckpt.glob("adapter_model.safetensors"))
    if not weights:
        return "it has no model.safetensors or adapter_model.safetensors"
    for f in weights:
        why = damaged_safetensors(f)
        if why:
            return f"{f.name} is damaged ({why})"
        try:
            with safe_open(str(f), "pt") as st:  # reads the header; a cut-off file fails on its last tensor
                names = list(st.keys())
                if names:
                    st.get_tensor(names[-1])
        except Exception as e:
            return f"{f.name} is unreadable ({type(e).__name__})"
    why = wrong_shape(ckpt, [f for f in weights if f.name.startswith("model")])
    if why:
        return why
    try:
        load_state(ckpt)
    except Exception as e:
        return f"{STATE_FILE} is unreadable ({type(e).__name__})"
    return None


def latest_good(run_dir: Path, log=print) -> Path | None:
    """The newest checkpoint that loads; each newer one that does not is named, with what is wrong with it."""
    for ckpt in reversed(candidates(Path(run_dir) / "checkpoints")):
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
    """Load a checkpoint's trained weights (full model or LoRA adapter) into an already built model; one that does
    not fit it (a tensor missing, extra or of another shape) is one sentence."""
    from safetensors.torch import load_file

    from ..engine.models import shape_sentence

    adapter = Path(ckpt) / "adapter_model.safetensors"
    if adapter.exists():
        from peft import set_peft_model_state_dict

        try:
            set_peft_model_state_dict(model, load_file(adapter))
        except RuntimeError as e:  # "size mismatch for ...: copying a param with shape ..."
            raise UserError(f"checkpoint {ckpt} does not fit this model ({str(e).strip().splitlines()[-1][:300]}): "
                            "resume from another checkpoint, with the same --model, --use-lora and lora_r as the "
                            "run.") from None
        return model
    state, shapes = {}, {n: tuple(t.shape) for n, t in model.state_dict().items()}
    for f in sorted(Path(ckpt).glob("model*.safetensors")):  # not ewc.safetensors
        part = load_file(f)
        bad = [n for n, t in part.items() if n in shapes and tuple(t.shape) != shapes[n]]
        if bad:
            raise UserError(f"checkpoint {ckpt} does not fit this model: "
                            f"{shape_sentence(f.name, bad[0], part[bad[0]].shape, shapes[bad[0]])}: resume from "
                            "another checkpoint (move this one aside), with the same --model as the run.")
        state.update(part)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise UserError(f"checkpoint {ckpt} does not fit this model (missing {list(missing)[:3]}, unexpected "
                         f"{list(unexpected)[:3]}): resume with the same --model as the run.")
    return model
