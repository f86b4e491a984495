"""Evaluation: greedy answers on held-out problems, accuracy per difficulty with intervals, before/after.

Every accuracy carries a 95% Wilson interval; a before/after change on the same problems carries the
paired difference with a bootstrap interval and McNemar's exact p-value (stats.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import rewards, stats, tasks
from .tracking import read_jsonl


def held_out(cfg) -> list[tasks.Example]:
    """The evaluation problems of a run: eval_task, or the test split of task (never seen in training)."""
    if cfg.eval_size == 0:
        return []
    spec = cfg.eval_task or cfg.task
    return tasks.load_task(spec, n=cfg.eval_size, seed=cfg.seed + 1, split="test",
                           on_error="skip" if cfg.skip_bad_lines else "raise")


def run_eval(sampler, tok, examples, cfg, out_path: Path | None, stops, log=print, batch_size: int = 64) -> list[dict]:
    """Greedy completions for every example; one record per problem, written as JSONL when out_path is given."""
    from .rollout import encode_prompts

    records, t0 = [], time.time()
    for i in range(0, len(examples), batch_size):
        part = examples[i:i + batch_size]
        prompts = encode_prompts(tok, [ex.question for ex in part], cfg.instruction)
        outs = sampler.generate(prompts, 1, cfg.eval_max_new_tokens, stops, tok.pad_token_id, temperature=0.0)
        for ex, ids in zip(part, outs, strict=True):
            text = tok.decode(ids, skip_special_tokens=True)
            pred = rewards.extract_answer(text, "auto")
            records.append({"id": ex.id, "difficulty": ex.difficulty, "question": ex.question, "answer": ex.answer,
                            "completion": text, "pred": pred, "correct": rewards.answers_match(pred, ex.answer),
                            "strict_correct": rewards.answers_match(rewards.extract_answer(text, "strict"),
                                                                    ex.answer)})
        done = len(records)
        log(f"  eval {done}/{len(examples)}: accuracy so far {sum(r['correct'] for r in records) / done:.3f} "
            f"({time.time() - t0:.0f}s)")
    if out_path is not None:
        Path(out_path).write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def by_level(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["difficulty"], []).append(r)
    return out


def compare(before: list[dict], after: list[dict]) -> dict:
    """Per level: before/after accuracy with Wilson intervals, paired difference with bootstrap CI and McNemar."""
    result = {}
    after_by_id = {r["id"]: r for r in after}
    for level, recs in by_level(before).items():
        pairs = [(r["correct"], after_by_id[r["id"]]["correct"]) for r in recs if r["id"] in after_by_id]
        entry = {"before": stats.accuracy_summary([r["correct"] for r in recs])}
        if pairs:
            b, a = zip(*pairs, strict=True)
            entry["after"] = stats.accuracy_summary(list(a))
            cmp = stats.paired_comparison(list(b), list(a))
            entry["delta"] = {"diff": cmp["diff"], "ci95": cmp["ci95"], "p_value": cmp["p_value"],
                              "significant": cmp["significant"], "sentence": stats.significance_sentence(cmp, level)}
        result[level] = entry
    return result


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


def write_summary(run: Path, cfg, steps: int, wall: float, log=print) -> dict:
    """summary.json and report.md for a run; prints the before/after table and the report's path."""
    from .report import write_report

    before, after = read_jsonl(run / "eval_before.jsonl"), read_jsonl(run / "eval_after.jsonl")
    levels = compare(before, after) if before else {}
    summary = {"model": cfg.model, "task": cfg.task, "steps": steps, "wall_seconds": round(wall, 1),
               "levels": levels}
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
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"checkpoint {ckpt} does not fit this model (missing {list(missing)[:3]}, unexpected "
                         f"{list(unexpected)[:3]}): resume with the same --model as the run.")
    return model
