"""Evaluation: greedy answers on held-out problems, accuracy per difficulty with intervals, before/after.

This module runs the model; each record holds every per-completion metric of metrics.py. evaltables.py pairs
before and after and makes the tables (Wilson intervals, Newcombe's paired interval, McNemar); report.py writes
summary.json and report.md. `run_sampled` draws k completions per problem instead, for pass@k and
majority-vote@k.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..data import answers, tasks
from . import metrics, stats

# problems per greedy batch: with more rows each decode step's matmuls run closer to the machine's peak (the 0.5B
# Qwen2 with LoRA on intermediate problems, 2026-11-24: 138 tokens/s in batches of 50, 176 in batches of 100,
# 193 in one of 200); the planner counts its KV cache in the peak memory
EVAL_BATCH = 200


def equal_batches(problems: int, most: int = EVAL_BATCH) -> tuple[int, int]:
    """How many batches of at most `most` problems `problems` need, and the rows of each (equal: no small tail)."""
    batches = max(1, -(-problems // most))
    return batches, max(1, -(-problems // batches))


def run_eval(sampler, tok, examples, instruction: str, sampling, out_path: Path | None = None, log=print,
             batch_size: int = EVAL_BATCH) -> list[dict]:
    """One completion for every example (greedy: `sampling` with temperature 0), each appended to the question
    with `instruction`, in equal batches of at most `batch_size`; one record per problem, written as JSONL when
    out_path is given."""
    from ..engine.rollout import encode_prompts

    use_mv = metrics.math_verify_available()
    if not use_mv:
        log("  note: math-verify is not installed, so correct_math_verify stays empty (pip install math-verify)")
    records, t0 = [], time.time()
    batch_size = equal_batches(len(examples), batch_size)[1]
    for i in range(0, len(examples), batch_size):
        part = examples[i:i + batch_size]
        prompts = encode_prompts(tok, [ex.question for ex in part], instruction)
        outs = sampler.generate(prompts, 1, sampling)
        for ex, ids in zip(part, outs, strict=True):
            text = tok.decode(ids, skip_special_tokens=True)
            kind = {"template": ex.template} if ex.template else {}
            records.append({"id": ex.id, "difficulty": ex.difficulty, **kind, "question": ex.question,
                            "answer": ex.answer, "completion": text,
                            **metrics.score_completion(text, ex.answer, ex.solution, use_mv)})
        done = len(records)
        log(f"  eval {done}/{len(examples)}: accuracy so far {sum(r['correct'] for r in records) / done:.3f} "
            f"({time.time() - t0:.0f}s)")
    if out_path is not None:
        Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def sampled_record(ex: tasks.Example, texts: list[str]) -> dict:
    """One problem's k sampled completions: answers, which are right, pass@1..k and the majority vote.

    Votes are answers as canonical numbers ("18.0" and "$18" are one vote); None answers do not vote.
    """
    preds = [answers.extract_answer(t, "auto") for t in texts]
    right = [answers.answers_match(p, ex.answer) for p in preds]
    votes = []
    for p in preds:
        value = answers.parse_number(p) if p is not None else None
        votes.append(tasks.canonical_number(value) if value is not None else p and p.strip().lower())
    majority = stats.majority_vote(votes)
    k, c = len(texts), sum(right)
    return {"id": ex.id, "difficulty": ex.difficulty, "question": ex.question, "answer": ex.answer,
            "samples": k, "completions": texts, "preds": preds, "sample_correct": right, "n_correct": c,
            "pass_at": {str(j): stats.pass_at_k(k, c, j) for j in range(1, k + 1)}, "maj_pred": majority,
            "maj_correct": answers.answers_match(majority, ex.answer)}


def run_sampled(sampler, tok, examples, instruction: str, sampling, k: int, seed: int, out_path: Path | None = None,
                log=print, batch_size: int = 64) -> list[dict]:
    """k completions per example drawn with `sampling` (a seeded torch.Generator); one `sampled_record` each."""
    import torch

    from ..engine.rollout import encode_prompts

    gen = torch.Generator().manual_seed(seed)
    per_call = max(1, batch_size // k)
    records, t0 = [], time.time()
    for i in range(0, len(examples), per_call):
        part = examples[i:i + per_call]
        prompts = encode_prompts(tok, [ex.question for ex in part], instruction)
        outs = sampler.generate(prompts, k, sampling, gen)
        texts = tok.batch_decode(outs, skip_special_tokens=True)
        records += [sampled_record(ex, texts[j * k:(j + 1) * k]) for j, ex in enumerate(part)]
        log(f"  sampled {len(records)}/{len(examples)} x {k} ({time.time() - t0:.0f}s)")
    if out_path is not None:
        Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records
