"""A stage as the loop runs it (`StageRun`): entering it (its data and order), promotion checks, and its end (every
held-out set evaluated, a row of the forgetting matrix; the Fisher diagonal sampled for EWC; a tagged checkpoint).
The stage's settings are config/stages.py's; the Fisher and EWC math is ewc.py's."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.stages import Stage
from ..data import example
from ..engine.batching import group_logprobs
from ..engine.progress import ProgressLines
from ..engine.prompts import encode_prompts
from ..errors import UserError
from ..eval import evaluate, forgetting
from ..rundir import append_jsonl, read_jsonl, stage_eval_path, write_status
from . import curriculum, ewc
from .runstate import RANK_SEED, Progress, Run, save_checkpoint

FISHER_SEED = 104729  # the Fisher of stage k samples with seed + RANK_SEED * rank + FISHER_SEED * (k + 1)


@dataclass(frozen=True)
class StageRun:
    """The stage the loop is in: its index among the run's `count` stages, its settings, and its training problems
    in the order they are drawn (the same on every rank and after a resume)."""

    index: int
    stage: Stage
    count: int
    data: list[example.Example]
    order: list[int]

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


def evaluate_all(r: Run, sets: list[curriculum.HeldOut], path: Path | None, log=None) -> list[dict]:
    """Greedy evaluation of the held-out sets, each at its own completion limit (sets with the same limit share
    batches), each rank on its share of the problems; the records gathered in the problems' order and written by
    rank 0 (with the forgetting matrix) when a path is given."""
    by_limit: dict[int, list[curriculum.HeldOut]] = {}
    for s in sets:
        by_limit.setdefault(s.max_new_tokens, []).append(s)
    done: dict[str, list[dict]] = {}
    for limit, group in by_limit.items():
        mine = [ex for s in group for ex in s.examples][r.world.rank::r.world.size]
        judge = evaluate.Judge.of(r.cfg.rewards, r.cfg.correct_reward, limit, r.cfg.reward_timeout)
        records = r.world.interleave(evaluate.run_eval(r.sampler, r.tok, mine, r.cfg.instruction,
                                                       r.sampling(limit, greedy=True), log=log or r.log,
                                                       system=r.cfg.system_prompt, judge=judge, tools=r.tools,
                                                       environments=r.environments,
                                                       max_calls=r.cfg.max_tool_calling_iterations))
        records = [{**x, "max_new_tokens": limit} for x in records]
        for s in group:
            done[s.task], records = records[:len(s.examples)], records[len(s.examples):]
    records = [x for s in sets for x in done[s.task]]
    if path is not None and r.world.main:
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in records))
        forgetting.write_forgetting(r.dir, r.cfg)
    return records


def check_base_records(path: Path, sets: list[curriculum.HeldOut]) -> str:
    """A resumed run's base evaluation (eval_before.jsonl) must be the one its config asks for: every held-out problem
    scored, at its set's completion limit (records from before the limit was recorded are taken as they are).
    Returns the line that says it is reused."""
    records = {x["id"]: x for x in read_jsonl(path)}
    for s in sets:
        missing = sum(ex.id not in records for ex in s.examples)
        limits = {records[ex.id].get("max_new_tokens", s.max_new_tokens) for ex in s.examples if ex.id in records}
        if missing or limits != {s.max_new_tokens}:
            what = (f"{missing} of its {len(s.examples)} problems have no base record" if missing else
                    f"its base records were scored at {max(limits - {s.max_new_tokens})} tokens, this config "
                    f"evaluates it at {s.max_new_tokens}")
            raise UserError(f"{path}: held-out set '{s.task}': {what}. Move the file away to evaluate the base model "
                            "again with this config, or resume with the config that made it.")
    return (f"the base model's evaluation: reusing {path} ({len(records)} problems, written "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(path.stat().st_mtime))}); move it away to evaluate again")


def fitting(r: Run, data: list[example.Example], limit: int, task: str) -> list[example.Example]:
    """The problems whose prompt, with `limit` new tokens, fits the model's context, checked once when they are
    loaded (generated problems are short by construction); the others stop the run naming the first one's
    `file:line`, or with skip_bad_lines are left out with a count."""
    context = getattr(r.model.config, "max_position_embeddings", None)
    mine = [ex for ex in data if not ex.template]
    if not context or not mine:
        return data
    prompts = encode_prompts(r.tok, [ex.chat(r.cfg.instruction, r.cfg.system_prompt) for ex in mine])
    long = [(ex.id, len(p)) for ex, p in zip(mine, prompts, strict=True) if len(p) + limit > context]
    if not long:
        return data
    what = (f"{len(long)} prompt(s) of task {task} do not fit the model's context of {context} tokens with {limit} "
            f"new tokens (first: {long[0][0]}, {long[0][1]} tokens)")
    if not r.cfg.skip_bad_lines:
        raise UserError(f"{what}: shorten them, lower max_new_tokens, or pass --skip-bad-lines to leave them out.")
    r.log(f"note: {what}: left out (--skip-bad-lines)")
    ids = {i for i, _ in long}
    return [ex for ex in data if ex.id not in ids]


def enter_stage(r: Run, k: int, stage: Stage, n_stages: int) -> StageRun:
    """Stage k of n_stages with its training problems and their order."""
    cfg = r.cfg
    data = fitting(r, curriculum.load(cfg, stage.task, cfg.train_size, cfg.seed + k, "train"), stage.max_new_tokens,
                   stage.task)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(cfg.seed + k)).tolist()
    if n_stages > 1:
        r.log(f"stage {k + 1}/{n_stages} '{stage.name}': task {stage.task}, up to {stage.steps} steps, lr "
              f"{stage.learning_rate:g}" + (f" ({stage.lr_scheduler})" if stage.lr_over_stage else "") + ", "
              f"{stage.max_new_tokens} tokens"
              + (f", promoted at validation accuracy {stage.promote_at:.2f}" if stage.promote_at else ""))
    return StageRun(k, stage, n_stages, data, order)


def validation_accuracy(r: Run, stage: Stage, val: list[example.Example], stage_step: int) -> float | None:
    """The stage's validation accuracy when a promotion check is due at its step `stage_step` (else None), at the
    limit its held-out sets are evaluated at."""
    if not stage.promote_at or stage_step % r.cfg.promote_every or not val:
        return None
    records = evaluate_all(r, [curriculum.HeldOut(stage.task, val, stage.eval_max_new_tokens)], None,
                           log=lambda *a: None)
    return sum(x["correct"] for x in records) / len(records)


def promoted(p: Progress, stage: Stage) -> bool:
    """Whether the stage's last validation accuracy reached its promote_at (then it trains no more)."""
    return p.validation is not None and p.validation >= stage.promote_at


def estimate_fisher(r: Run, p: Progress, s: StageRun) -> dict[str, torch.Tensor]:
    """Fisher diagonal from fisher_samples completions sampled by the policy on fresh problems of the stage (from its
    data position at `p`; each rank samples its share; the sums of squared gradients are added up over the ranks).
    The samples come from their own generator, so a run with EWC draws the same problems and rollouts as one
    without, up to its weights."""
    cfg, n = r.cfg, r.cfg.fisher_samples
    batch = [s.data[s.order[(p.data_pos + i) % len(s.order)]] for i in range(n)][r.world.rank::r.world.size]
    prompts = encode_prompts(r.tok, [ex.chat(cfg.instruction, cfg.system_prompt) for ex in batch])
    gen = torch.Generator().manual_seed(cfg.seed + RANK_SEED * r.world.rank + FISHER_SEED * (s.index + 1))
    sampling = dataclasses.replace(r.sampling(s.stage.max_new_tokens), logprobs=False,
                                   progress=ProgressLines(r.log, "  Fisher: sampling"))
    completions = r.sampler.generate(prompts, 1, sampling, gen)
    tick = ProgressLines(r.log, "  Fisher: gradients", "sample", "samples/s")

    def seq_logprob(i: int) -> torch.Tensor:
        logp, mask = group_logprobs(r.model, prompts, completions, [i], 1, r.tok.pad_token_id, cfg.temperature,
                                    r.autocast, cfg.gradient_checkpointing)
        if i:
            tick(i, len(batch))
        return (logp * mask).sum()

    fisher = ewc.fisher_diagonal(r.model, seq_logprob, n, len(batch), r.world.sum_tensors)
    tick.end()
    return fisher


def finish_stage(r: Run, p: Progress, s: StageRun, eval_set: list[curriculum.HeldOut], resumed: bool) -> None:
    """Evaluate every held-out set (a row of the forgetting matrix), estimate the Fisher, save a tagged checkpoint
    at `p` (its stage ended) and record the stage in stages.jsonl. `resumed`: the run was resumed from this
    stage's own end checkpoint, so that only a Fisher now due is left (it was the last stage when it ended: a run
    extended by more stages anchors it all the same)."""
    cfg, t0, stage = r.cfg, time.time(), s.stage
    fisher_due = cfg.ewc_lambda > 0 and not s.last and stage.name not in r.ewc.stages
    if resumed:
        if fisher_due:
            add_fisher(r, p, s)
            save_checkpoint(r, p, tag=stage.name)
        return
    record = {"stage": stage.name, "stage_index": s.index, "steps": p.stage_step, "end_step": p.step,
              "promoted": promoted(p, stage), "validation_accuracy": p.validation}
    if p.type_counts:  # prioritized sampling: what the draws were weighted by, samples and right answers by type
        record["type_counts"] = p.type_counts
    path = stage_eval_path(r.dir, s.index, stage.name)
    if eval_set and (cfg.eval_every_stage or s.last):
        if r.world.main:
            write_status(r.dir, state="evaluating", stage=stage.name)
        r.log(f"stage '{stage.name}' done: evaluating {sum(len(s.examples) for s in eval_set)} held-out problems ...")
        evaluate_all(r, eval_set, path)
    record["eval_seconds"] = round(time.time() - t0, 1)
    if fisher_due:
        record |= add_fisher(r, p, s)
    save_checkpoint(r, p, tag=stage.name)
    if r.world.main:
        append_jsonl(r.dir / "stages.jsonl", record)


def add_fisher(r: Run, p: Progress, s: StageRun) -> dict:
    """Anchor EWC at the stage's end: its Fisher diagonal and the weights now."""
    t0 = time.time()
    r.ewc.add_stage(s.stage.name, estimate_fisher(r, p, s), dict(ewc.trainable(r.model)))
    seconds = round(time.time() - t0, 1)
    r.log(f"Fisher diagonal of stage '{s.stage.name}' from {r.cfg.fisher_samples} samples in {seconds:.0f}s")
    return {"fisher_samples": r.cfg.fisher_samples, "fisher_seconds": seconds}
