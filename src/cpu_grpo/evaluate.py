"""Evaluation: greedy answers on held-out problems, accuracy per difficulty with intervals, before/after.

Every accuracy carries a 95% Wilson interval; a before/after change on the same problems carries the
paired difference with a bootstrap interval and McNemar's exact p-value (stats.py). Each record holds
every per-completion metric of metrics.py; evaltables.py turns them into tables. `run_sampled` draws
k completions per problem instead, for pass@k and majority-vote@k.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import evaltables, metrics, rewards, stats, tasks
from .tracking import code_version, read_jsonl


def run_eval(sampler, tok, examples, cfg, out_path: Path | None, stops, log=print, batch_size: int = 64) -> list[dict]:
    """Greedy completions for every example; one record per problem, written as JSONL when out_path is given."""
    from .rollout import encode_prompts

    use_mv = metrics.math_verify_available()
    if not use_mv:
        log("  note: math-verify is not installed, so correct_math_verify stays empty (pip install math-verify)")
    records, t0 = [], time.time()
    for i in range(0, len(examples), batch_size):
        part = examples[i:i + batch_size]
        prompts = encode_prompts(tok, [ex.question for ex in part], cfg.instruction)
        outs = sampler.generate(prompts, 1, cfg.eval_max_new_tokens, stops, tok.pad_token_id, temperature=0.0)
        for ex, ids in zip(part, outs, strict=True):
            text = tok.decode(ids, skip_special_tokens=True)
            records.append({"id": ex.id, "difficulty": ex.difficulty, "question": ex.question, "answer": ex.answer,
                            "completion": text, **metrics.score_completion(text, ex.answer, ex.solution, use_mv)})
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
    preds = [rewards.extract_answer(t, "auto") for t in texts]
    right = [rewards.answers_match(p, ex.answer) for p in preds]
    votes = []
    for p in preds:
        value = rewards.parse_number(p) if p is not None else None
        votes.append(tasks.canonical_number(value) if value is not None else p and p.strip().lower())
    majority = stats.majority_vote(votes)
    k, c = len(texts), sum(right)
    return {"id": ex.id, "difficulty": ex.difficulty, "question": ex.question, "answer": ex.answer,
            "samples": k, "completions": texts, "preds": preds, "sample_correct": right, "n_correct": c,
            "pass_at": {str(j): stats.pass_at_k(k, c, j) for j in range(1, k + 1)}, "maj_pred": majority,
            "maj_correct": rewards.answers_match(majority, ex.answer)}


def run_sampled(sampler, tok, examples, cfg, k: int, temperature: float, seed: int, out_path: Path | None, stops,
                log=print, batch_size: int = 64) -> list[dict]:
    """k sampled completions per example (a seeded torch.Generator); one `sampled_record` per problem."""
    import torch

    from .rollout import encode_prompts

    gen = torch.Generator().manual_seed(seed)
    per_call = max(1, batch_size // k)
    records, t0 = [], time.time()
    for i in range(0, len(examples), per_call):
        part = examples[i:i + per_call]
        prompts = encode_prompts(tok, [ex.question for ex in part], cfg.instruction)
        outs = sampler.generate(prompts, k, cfg.eval_max_new_tokens, stops, tok.pad_token_id,
                                temperature=temperature, top_k=cfg.top_k, top_p=cfg.top_p, generator=gen)
        texts = tok.batch_decode(outs, skip_special_tokens=True)
        records += [sampled_record(ex, texts[j * k:(j + 1) * k]) for j, ex in enumerate(part)]
        log(f"  sampled {len(records)}/{len(examples)} x {k} ({time.time() - t0:.0f}s)")
    if out_path is not None:
        Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


by_level = evaltables.by_level


def compare(before: list[dict], after: list[dict]) -> dict:
    """Per level: before/after accuracy with Wilson intervals, paired difference with bootstrap CI and McNemar."""
    return accuracy_levels(evaltables.metric_summary(before, after, keys=("correct",)))


def accuracy_levels(metrics: dict) -> dict:
    """The accuracy entries of a metric summary (evaltables.metric_summary), each change with its sentence."""
    out = {}
    for level, entries in metrics.items():
        entry = dict(entries["correct"])
        if "delta" in entry:
            entry["delta"] = {**entry["delta"], "sentence": stats.significance_sentence(entry["delta"], level)}
        out[level] = entry
    return out


def table(levels: dict) -> str:
    """Markdown table of a comparison."""
    head = "| level | n | before (95% CI) | after (95% CI) | change (95% CI) | McNemar p |\n|---|---|---|---|---|---|\n"
    rows = []
    for level, e in levels.items():
        def acc(s):
            return f"{100 * s['accuracy']:.1f}% ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})"
        after = acc(e["after"]) if "after" in e else "-"
        if "delta" in e:
            d = e["delta"]
            change = f"{100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f} to {100 * d['ci95'][1]:+.1f})"
            p = f"{d['p_value']:.2g}"
        else:
            change, p = "-", "-"
        rows.append(f"| {level} | {e['before']['n']} | {acc(e['before'])} | {after} | {change} | {p} |")
    return head + "\n".join(rows) + "\n"


def write_summary(run: Path, cfg, steps: int, wall: float, log=print, profile: str = "") -> dict:
    """summary.json and report.md for a run; prints the before/after table and the report's path."""
    from .report import write_report

    before, after = read_jsonl(run / "eval_before.jsonl"), read_jsonl(run / "eval_after.jsonl")
    metrics = evaltables.metric_summary(before, after or None) if before else {}
    levels = accuracy_levels(metrics)
    from .config import plan

    stages = [f"{st.name} ({st.task}, {st.steps} steps)" if st.name != st.task else f"{st.name} ({st.steps} steps)"
              for st in plan(cfg)]
    summary = {"model": cfg.model, "task": cfg.task, "stages": stages, "ewc_lambda": cfg.ewc_lambda,
               "profile": profile, "seed": cfg.seed, "commit": code_version(), "steps": steps,
               "wall_seconds": round(wall, 1),
               "levels": levels, "metrics": metrics}
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    report = write_report(run, cfg, summary)
    if levels:
        log("\n" + table(levels))
        for e in levels.values():
            if "delta" in e:
                log(e["delta"]["sentence"])
    log(f"report: {report}")
    return summary


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
        raise ValueError(f"checkpoint {ckpt} does not fit this model (missing {list(missing)[:3]}, unexpected "
                         f"{list(unexpected)[:3]}): resume with the same --model as the run.")
    return model
