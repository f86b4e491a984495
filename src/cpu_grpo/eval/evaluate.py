"""Evaluation: greedy answers on held-out problems, accuracy per difficulty with intervals, before/after.

This module runs the model; each record holds every per-completion metric of metrics.py. evaltables.py pairs
before and after and makes the tables (Wilson intervals, Newcombe's paired interval, McNemar); report.py writes
summary.json and report.md. `run_sampled` draws k completions per problem instead, for pass@k and
majority-vote@k.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..data import answers, example, rewards, tasks, verifiers
from ..engine.progress import ProgressLines
from . import metrics, stats

# problems per greedy batch: with more rows each decode step's matmuls run closer to the machine's peak (the 0.5B
# Qwen2 with LoRA on intermediate problems, 2026-11-24: 138 tokens/s in batches of 50, 176 in batches of 100,
# 193 in one of 200); the planner counts its KV cache in the peak memory
EVAL_BATCH = 200


def equal_batches(problems: int, most: int = EVAL_BATCH) -> tuple[int, int]:
    """How many batches of at most `most` problems `problems` need, and the rows of each (equal: no small tail)."""
    batches = max(1, -(-problems // most))
    return batches, max(1, -(-problems // batches))


@dataclass(frozen=True)
class Judge:
    """What "correct" means in an evaluation: math problems by their extracted answer (the math metrics with it),
    unless `everywhere`; rows of your own, and every row when `everywhere`, by the reward `fn` scoring 1."""

    fn: Callable | None = None
    everywhere: bool = False
    time_limit: float = 0.0  # seconds a call of fn may take (the run's reward_timeout; 0: none)

    @classmethod
    def of(cls, rewards: list[str], correct_reward: str = "", max_new_tokens: int = 256,
           time_limit: float = 0.0) -> Judge:
        """The config's correct_reward when set (for every row), else its first reward (for rows of your own)."""
        from ..data.rewards import load_reward

        return cls(load_reward(correct_reward or rewards[0], max_new_tokens), bool(correct_reward), time_limit)

    def by_reward(self, ex: example.Example) -> bool:
        return self.everywhere or not ex.math

    def verdicts(self, examples: list, texts: list, judged: list[float]) -> list[bool]:
        """Whether each completion is right, from the judging reward's values already computed for it (a training
        step's: the reward is not called again, and a completion cut at the limit has scored 0): a math row by its
        extracted answer unless `everywhere`, any other by its value being 1."""
        by_answer = rewards.correctness_reward(texts, [ex.answer for ex in examples])
        return [v == 1.0 if self.by_reward(ex) else bool(a)
                for ex, a, v in zip(examples, by_answer, judged, strict=True)]

    def all_wrong(self, examples: list, records: dict) -> str:
        """A note when the reward judged 10 or more problems and scored every one 0: a task too hard, or a column
        it reads in a type it does not expect (a Parquet file written by pandas turns text of digits into numbers);
        '' otherwise."""
        mine = [ex for ex in examples if self.by_reward(ex)]
        if len(mine) < 10 or any(records[ex.id]["correct"] for ex in mine):
            return ""
        kinds = ", ".join(f"{k}: {type(v).__name__}" for k, v in mine[0].columns.items())
        return (f"  note: reward {getattr(self.fn, '__name__', 'reward')} scored every one of the {len(mine)} "
                f"problems it judged 0: if that is not what you expect, check the columns it reads and their types "
                f"({kinds or 'none'})")

    def scores(self, examples: list, texts: list[str], outs: list[list[int]], log=print,
               transcripts: list | None = None, envs: list | None = None) -> list[bool | None]:
        """Whether each completion is right by the reward (None for those judged by their answer); with tools the
        reward gets each exchange (`transcripts`) and with environments each one's (`envs`), as in training."""
        mine = [i for i, ex in enumerate(examples) if self.by_reward(ex)]
        if not mine:
            return [None] * len(examples)
        if self.fn is None:
            from ..errors import UserError

            raise UserError("these rows are judged by a reward: name it with --correct-reward (e.g. exact_match, "
                            "code), or train with rewards that start with it")
        part = [examples[i] for i in mine]
        columns = {**rewards.reward_columns(part), "completion_ids": [outs[i] for i in mine],
                   **({"environments": [envs[i] for i in mine]} if envs else {})}
        given = [transcripts[i] for i in mine] if transcripts else \
            rewards.as_completions([texts[i] for i in mine], part)
        values = rewards.call_reward(self.fn, given, columns, [ex.id for ex in part], log, self.time_limit)
        out: list[bool | None] = [None] * len(examples)
        for i, v in zip(mine, values, strict=True):
            out[i] = v == 1.0
        return out


def run_eval(sampler, tok, examples, instruction: str, sampling, out_path: Path | None = None, log=print,
             batch_size: int = EVAL_BATCH, system: str = "", judge: Judge = Judge(), stop=lambda: False,
             tools: list = (), max_calls: int = 0, environments=None) -> list[dict]:
    """One completion for every example (greedy: `sampling` with temperature 0), asked as `Example.chat` says (the
    instruction appended to math questions, the system turn), in equal batches of at most `batch_size`; one record
    per problem (correct as `judge` decides; finished: the model ended it within the limit).

    With `out_path`, each batch's records are appended as soon as they are made, and the problems that file already
    holds are not evaluated again (a rerun continues where a killed one ended); `stop()` true after a batch ends the
    evaluation there, its records kept. With `tools`, each problem is a conversation that may call them (as in
    training, engine/agent.py) and with `environments` one that acts in its own (data/environments.py): its record
    keeps the exchange, the calls and the failed calls."""
    from ..data.environments import episodes
    from ..engine.agent import generating, sample_with_tools
    from ..engine.prompts import encode_prompts

    use_mv = metrics.math_verify_available()
    if not use_mv and any(ex.math for ex in examples):
        log("  note: math-verify is not installed, so correct_math_verify stays empty (pip install math-verify)")
    kept = _kept(out_path, examples, log)
    todo = [ex for ex in examples if ex.id not in kept]
    records, t0 = [], time.time()
    batches, batch_size = equal_batches(len(todo), batch_size) if todo else (1, 1)
    for i in range(0, len(todo), batch_size):
        part = todo[i:i + batch_size]
        tick = ProgressLines(log, f"  eval batch {i // batch_size + 1}/{batches} ({len(part)} problems)")
        sampled = dataclasses.replace(sampling, progress=tick)
        chats, envs = [ex.chat(instruction, system) for ex in part], None
        if tools or environments:
            started = episodes(environments, part, chats, 1, tools)
            turns = sample_with_tools(tok, generating(sampler, sampled), started.chats, 1, started.tools,
                                      sampled.max_new_tokens, max_calls, sampled.stops)[1]
            outs, texts, envs = [t.ids for t in turns], [answers.completion_text(t.messages) for t in turns], \
                started.envs or None
        else:
            outs = sampler.generate(encode_prompts(tok, chats), 1, sampled)
            turns, texts = None, [tok.decode(ids, skip_special_tokens=True) for ids in outs]
        judged = judge.scores(part, texts, outs, log, [t.messages for t in turns] if turns else None, envs)
        new = [_record(ex, text, ids, right, sampling, use_mv, getattr(judge.fn, "__name__", "reward"))
               for ex, ids, text, right in zip(part, outs, texts, judged, strict=True)]
        if turns:  # the exchange, for inspection and the report's tool counts
            new = [r | {"transcript": t.messages, "tool_calls": t.calls, "tool_failures": t.failed}
                   for r, t in zip(new, turns, strict=True)]
        if out_path is not None:
            with open(out_path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in new))
        records += new
        log(f"  eval {len(kept) + len(records)}/{len(examples)}: accuracy so far "
            f"{sum(r['correct'] for r in records) / len(records):.3f} ({time.time() - t0:.0f}s)")
        if stop():
            log(f"  stopped after {len(kept) + len(records)} of {len(examples)} problems"
                + (f"; the same command continues from {out_path}" if out_path is not None else ""))
            break
    by_id = {**kept, **{r["id"]: r for r in records}}
    if note := judge.all_wrong([ex for ex in examples if ex.id in by_id], by_id):
        log(note)
    return [by_id[ex.id] for ex in examples if ex.id in by_id]


def _record(ex: example.Example, text: str, ids: list[int], right: bool | None, sampling, use_mv: bool,
            judge: str = "") -> dict:
    kind = {"template": ex.template} if ex.template else {}
    kind |= {"split": ex.split} if ex.split else {}  # "train": a row a run on its task trains on
    scored = metrics.score_completion(text, ex.answer, ex.solution, use_mv) if right is None else \
        {"pred": verifiers.final_answer(text)[:200], "correct": right, "judge": judge}
    return {"id": ex.id, "difficulty": ex.difficulty, **kind, "question": ex.question, "answer": ex.answer,
            "completion": text, "finished": bool(ids) and ids[-1] in sampling.stops, **scored}


def _kept(out_path: Path | None, examples: list, log) -> dict[str, dict]:
    """The records an earlier run of the same evaluation left in out_path, by id (a half-written last line is cut);
    a file of other problems is refused."""
    from ..errors import UserError
    from ..rundir import cut_jsonl, read_jsonl

    if out_path is None or not Path(out_path).exists():
        return {}
    cut_jsonl(Path(out_path), 10**12)  # a line cut off by a kill
    kept = {r["id"]: r for r in read_jsonl(Path(out_path)) if "id" in r}
    ids = {ex.id for ex in examples}
    if kept and not set(kept) <= ids:
        raise UserError(f"{out_path} holds records of other problems: choose another --output, or move it away.")
    if kept:
        log(f"  continuing: {len(kept)} of {len(examples)} problems already in {out_path}")
    return kept


def sampled_record(ex: example.Example, texts: list[str], judged: list | None = None) -> dict:
    """One problem's k sampled completions: answers, which are right, pass@1..k and the majority vote.

    Math votes are answers as canonical numbers ("18.0" and "$18" are one vote), None answers do not vote; rows
    judged by a reward (`judged`: one bool each) vote with their normalised final answers, and the majority is
    right when a completion that gave it is.
    """
    if judged and judged[0] is not None:
        preds = [verifiers.final_answer(t)[:200] for t in texts]
        right, votes = [bool(j) for j in judged], [verifiers.normalize(p) or None for p in preds]
        majority = stats.majority_vote(votes)
        maj_correct = any(r for r, v in zip(right, votes, strict=True) if v is not None and v == majority)
    else:
        preds = [answers.extract_answer(t, "auto") for t in texts]
        right, votes = [answers.answers_match(p, ex.answer) for p in preds], []
        for p in preds:
            value = answers.parse_number(p) if p is not None else None
            votes.append(tasks.canonical_number(value) if value is not None else p and p.strip().lower())
        majority = stats.majority_vote(votes)
        maj_correct = answers.answers_match(majority, ex.answer)
    k, c = len(texts), sum(right)
    return {"id": ex.id, "difficulty": ex.difficulty, "question": ex.question, "answer": ex.answer,
            "samples": k, "completions": texts, "preds": preds, "sample_correct": right, "n_correct": c,
            "pass_at": {str(j): stats.pass_at_k(k, c, j) for j in range(1, k + 1)}, "maj_pred": majority,
            "maj_correct": maj_correct}


def run_sampled(sampler, tok, examples, instruction: str, sampling, k: int, seed: int, out_path: Path | None = None,
                log=print, batch_size: int = 64, system: str = "", judge: Judge = Judge()) -> list[dict]:
    """k completions per example drawn with `sampling` (a seeded torch.Generator); one `sampled_record` each."""
    import torch

    from ..engine.prompts import encode_prompts

    gen = torch.Generator().manual_seed(seed)
    per_call = max(1, batch_size // k)
    records, t0 = [], time.time()
    for i in range(0, len(examples), per_call):
        part = examples[i:i + per_call]
        prompts = encode_prompts(tok, [ex.chat(instruction, system) for ex in part])
        outs = sampler.generate(prompts, k, sampling, gen)
        texts = tok.batch_decode(outs, skip_special_tokens=True)
        judged = judge.scores([ex for ex in part for _ in range(k)], texts, outs, log)
        records += [sampled_record(ex, texts[j * k:(j + 1) * k], judged[j * k:(j + 1) * k])
                    for j, ex in enumerate(part)]
        log(f"  sampled {len(records)}/{len(examples)} x {k} ({time.time() - t0:.0f}s)")
    if out_path is not None:
        Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records
