"""Every evaluation metric per difficulty level, as numbers (for summary.json) and as markdown tables.

Rates (accuracy under each extractor, reasoning quality, consistency) carry a 95% Wilson interval;
means (calculation steps, pass@k) a percentile bootstrap interval. Before/after on the same problems: for rates
the paired difference with Newcombe's paired interval and McNemar's exact p-value (significant: p < 0.05), for
means the paired difference with a bootstrap interval (significant: it excludes zero). A metric that is
None for a problem (no computation to be consistent with, math-verify not installed) leaves that
problem out of that metric, and out of its pairs. Records of older runs that lack a metric skip it.
"""

from __future__ import annotations

import math

import numpy as np

from . import stats

RATES = {
    "correct": "accuracy (auto extractor)",
    "correct_strict": "accuracy, strict (`#### N`)",
    "correct_flexible": "accuracy, flexible (last number)",
    "correct_math_verify": "accuracy, math-verify",
    "lm_eval_strict": "lm-eval gsm8k strict-match",
    "lm_eval_flexible": "lm-eval gsm8k flexible-extract",
    "reasoning_quality": "reasoning quality (>= 2 steps of work)",
    "consistent": "answer-work consistency",
}
MEANS = {
    "calc_steps": "calculation steps per answer",
    "calc_correct_frac": "calculations arithmetically right (mean fraction)",
}


def by_level(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["difficulty"], []).append(r)
    return out


def _bootstrap_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of n_boot resamples (with replacement) of x, drawn 1,000 at a time to bound memory."""
    rng = np.random.default_rng(seed)
    sizes = [1000] * (n_boot // 1000) + ([n_boot % 1000] if n_boot % 1000 else [])
    return np.concatenate([x[rng.integers(0, len(x), (m, len(x)))].mean(axis=1) for m in sizes])  # (n_boot,)


def mean_summary(values: list[float], n_boot: int = 10000, seed: int = 0) -> dict:
    """{"mean", "n", "ci95"}: the mean with a percentile bootstrap 95% interval (it stays within the data's range).

    >>> mean_summary([0.0, 1.0])  # resampled means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    {'mean': 0.5, 'n': 2, 'ci95': [0.0, 1.0]}
    """
    if not values:
        return {"mean": math.nan, "n": 0, "ci95": [math.nan, math.nan]}
    x = np.asarray(values, dtype=float)  # (n,)
    lo, hi = np.percentile(_bootstrap_means(x, n_boot, seed), [2.5, 97.5])
    return {"mean": float(x.mean()), "n": len(x), "ci95": [float(lo), float(hi)]}


def paired_mean_diff(before: list[float], after: list[float], n_boot: int = 10000, seed: int = 0) -> dict:
    """mean(after - before) with a percentile 95% interval from resampling the pairs."""
    d = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)  # (n,)
    lo, hi = np.percentile(_bootstrap_means(d, n_boot, seed), [2.5, 97.5])
    return {"diff": float(d.mean()), "ci95": [float(lo), float(hi)], "n": len(d),
            "significant": bool(lo > 0 or hi < 0)}


def _pairs(before: list[dict], after: list[dict], key: str) -> tuple[list, list]:
    after_by_id = {r["id"]: r.get(key) for r in after}
    pairs = [(r[key], after_by_id[r["id"]]) for r in before
             if r.get(key) is not None and after_by_id.get(r["id"]) is not None]
    return [b for b, _ in pairs], [a for _, a in pairs]


def _entry(key: str, before: list[dict], after: list[dict] | None) -> dict | None:
    rate = key in RATES
    summarize = stats.accuracy_summary if rate else mean_summary
    values = [r[key] for r in before if r.get(key) is not None]
    if not values:
        return None
    entry = {"before": summarize(values)}
    after_values = [r[key] for r in after or [] if r.get(key) is not None]
    if after_values:
        entry["after"] = summarize(after_values)
        b, a = _pairs(before, after, key)
        if b:
            if rate:
                cmp = stats.paired_comparison(b, a)
                entry["delta"] = {k: cmp[k] for k in ("diff", "ci95", "p_value", "significant", "n")}
            else:
                entry["delta"] = paired_mean_diff(b, a)
    return entry


def metric_summary(before: list[dict], after: list[dict] | None = None, keys=(*RATES, *MEANS)) -> dict:
    """{level: {metric: {"before", ["after", "delta"]}}} for every metric of `keys` present in the records."""
    after_levels = by_level(after) if after is not None else {}
    out = {}
    for level, recs in by_level(before).items():
        level_after = after_levels.get(level, []) if after is not None else None
        entries = {key: _entry(key, recs, level_after) for key in keys}
        out[level] = {k: e for k, e in entries.items() if e is not None}
        judges = {r.get("judge") for r in recs}
        if "correct" in out[level] and len(judges) == 1 and None not in judges:  # judged by a reward, not an answer
            out[level]["correct"]["judge"] = judges.pop()
    return out


def pct_cell(s: dict | None, value: str = "accuracy", n: bool = False) -> str:
    """A rate with its 95% interval, the one way every table writes it: "46.0% (39.9-52.2)" (", n=250" with n).

    >>> pct_cell({"accuracy": 0.46, "ci95": [0.399, 0.522], "n": 250}, n=True)
    '46.0% (39.9-52.2, n=250)'
    """
    if not s or value not in s:
        return "-"
    lo, hi = s.get("ci95") or [math.nan, math.nan]
    count = f", n={s['n']}" if n else ""
    return f"{100 * s[value]:.1f}% ({100 * lo:.1f}-{100 * hi:.1f}{count})"


def _fmt(s: dict, rate: bool) -> str:
    if rate:
        return pct_cell(s)
    if s["n"] == 0:
        return "-"
    return f"{s['mean']:.2f} ({s['ci95'][0]:.2f}-{s['ci95'][1]:.2f})"


def _fmt_delta(d: dict, rate: bool) -> tuple[str, str]:
    if rate:
        text = f"{100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f} to {100 * d['ci95'][1]:+.1f})"
        return text, f"{d['p_value']:.2g}"
    return f"{d['diff']:+.2f} ({d['ci95'][0]:+.2f} to {d['ci95'][1]:+.2f})", "-"


def _own_n(text: str, n: int, row_n: int) -> str:
    return text if n == row_n else f"{text} n={n}"


def _label(key: str, e: dict) -> str:
    """A metric's name; "correct" of rows judged by a reward (their records name it) says which reward."""
    return f"accuracy (reward {e['judge']})" if key == "correct" and "judge" in e else RATES.get(key) or MEANS[key]


def metric_table(summary: dict) -> str:
    """Markdown: one table per level, a row per metric; before/after columns when the summary has them. A row's n
    is its problems before; an after or change cell over other problems (consistency: only answers with a step, and
    its change only problems with one on both sides) says its own n."""
    out = []
    for level, entries in summary.items():
        paired = any("after" in e for e in entries.values())
        if paired:
            head = ("| metric | n | before (95% CI) | after (95% CI) | change (95% CI) | McNemar p |\n"
                    "|---|---|---|---|---|---|")
        else:
            head = "| metric | n | value (95% CI) |\n|---|---|---|"
        rows = []
        for key, e in entries.items():
            rate = key in RATES
            label = _label(key, e)
            if not paired:
                rows.append(f"| {label} | {e['before']['n']} | {_fmt(e['before'], rate)} |")
                continue
            n = e["before"]["n"]
            change, p = _fmt_delta(e["delta"], rate) if "delta" in e else ("-", "-")
            change = _own_n(change, e["delta"]["n"], n) if "delta" in e else change
            after = _own_n(_fmt(e["after"], rate), e["after"]["n"], n) if "after" in e else "-"
            rows.append(f"| {label} | {n} | {_fmt(e['before'], rate)} | {after} | {change} | {p} |")
        out.append(f"**{level}**\n\n{head}\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


ACCURACY_COLUMNS = {"correct": "auto", "correct_strict": "strict", "correct_flexible": "flexible",
                    "correct_math_verify": "math-verify", "lm_eval_strict": "lm-eval strict-match",
                    "lm_eval_flexible": "lm-eval flexible-extract"}
WORK_COLUMNS = {"reasoning_quality": "reasoning quality", "consistent": "consistent", "calc_steps": "calc steps",
                "calc_correct_frac": "calcs right"}


def level_tables(summary: dict) -> str:
    """Markdown for one evaluation (no after): a row per level; accuracy per extractor, then the work
    (a cell over fewer problems than its row, as consistency, says its own n)."""
    out = []
    for title, columns in (("accuracy (95% CI)", ACCURACY_COLUMNS), ("the work (95% CI)", WORK_COLUMNS)):
        keys = [k for k in columns if any(k in entries for entries in summary.values())]
        if not keys:
            continue
        judges = {entries["correct"].get("judge") for entries in summary.values() if "correct" in entries}
        names = [f"reward {judges.pop()}" if k == "correct" and len(judges) == 1 and None not in judges else columns[k]
                 for k in keys]
        head = f"| level | n | {' | '.join(names)} |\n|---|---|" + "---|" * len(keys) + "\n"
        rows = []
        for level, entries in summary.items():
            n = max(e["before"]["n"] for e in entries.values())
            cells = [_fmt(entries[k]["before"], k in RATES) + (f" n={entries[k]['before']['n']}"
                     if entries[k]["before"]["n"] != n else "") if k in entries else "-" for k in keys]
            rows.append(f"| {level} | {n} | " + " | ".join(cells) + " |")
        out.append(f"{title}:\n\n{head}" + "\n".join(rows) + "\n")
    return "\n".join(out)


def metric_sentences(summary: dict) -> list[str]:
    """One sentence per paired change: its size, interval, and whether it is significant."""
    out = []
    for level, entries in summary.items():
        for key, e in entries.items():
            if "delta" not in e:
                continue
            d = e["delta"]
            if key in RATES:
                out.append(stats.significance_sentence(d, f"{level}, {_label(key, e)}"))
                continue
            verdict = ("significant" if d["significant"] else "not significant (the interval includes zero)")
            out.append(f"{level}, {MEANS[key]}: {d['diff']:+.2f} (95% CI {d['ci95'][0]:+.2f} to "
                       f"{d['ci95'][1]:+.2f}): {verdict}.")
    return out


# ---------------------------------------------------------------------------- sampling metrics


def pass_ks(k: int) -> list[int]:
    """The k's reported in tables: all up to 8, then powers of two and k itself.

    >>> pass_ks(4), pass_ks(20)
    ([1, 2, 3, 4], [1, 2, 4, 8, 16, 20])
    """
    if k <= 8:
        return list(range(1, k + 1))
    return sorted({2**i for i in range(k.bit_length()) if 2**i <= k} | {k})


def sampled_summary(records: list[dict]) -> dict:
    """Per level: pass@j for every j (mean of the unbiased per-problem estimates, bootstrap interval) and
    maj@k (the majority-vote answer right, Wilson interval)."""
    out = {}
    for level, recs in by_level(records).items():
        ks = sorted(int(j) for j in recs[0]["pass_at"])
        entry = {f"pass@{j}": mean_summary([r["pass_at"][str(j)] for r in recs]) for j in ks}
        entry[f"maj@{ks[-1]}"] = stats.accuracy_summary([r["maj_correct"] for r in recs])
        out[level] = entry
    return out


def sampled_table(summary: dict) -> str:
    """Markdown: a row per level, a column per pass@j (j from `pass_ks`) and maj@k, with 95% intervals."""
    first = next(iter(summary.values()))
    k = max(int(name.split("@")[1]) for name in first)
    cols = [f"pass@{j}" for j in pass_ks(k)] + [f"maj@{k}"]
    head = "| level | n | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols) + "\n"
    rows = []
    for level, entry in summary.items():
        cells = []
        for c in cols:
            cells.append(pct_cell(entry[c], "accuracy" if c.startswith("maj") else "mean"))
        rows.append(f"| {level} | {entry[cols[-1]]['n']} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def compare(before: list[dict], after: list[dict]) -> dict:
    """Per level: before/after accuracy with Wilson intervals; the paired change, Newcombe's interval, McNemar."""
    return accuracy_levels(metric_summary(before, after, keys=("correct",)))


def accuracy_levels(metrics: dict) -> dict:
    """The accuracy entries of a metric summary (evaltables.metric_summary), each change with its sentence."""
    out = {}
    for level, entries in metrics.items():
        entry = dict(entries["correct"])
        if "delta" in entry:
            entry["delta"] = {**entry["delta"], "sentence": stats.significance_sentence(entry["delta"], level)}
        out[level] = entry
    return out


def accuracy_table(levels: dict) -> str:
    """Markdown table of a before/after comparison (`compare`, `accuracy_levels`): a row per level."""
    head = "| level | n | before (95% CI) | after (95% CI) | change (95% CI) | McNemar p |\n|---|---|---|---|---|---|\n"
    rows = []
    for level, e in levels.items():
        after = pct_cell(e["after"]) if "after" in e else "-"
        change, p = _fmt_delta(e["delta"], rate=True) if "delta" in e else ("-", "-")
        rows.append(f"| {level} | {e['before']['n']} | {pct_cell(e['before'])} | {after} | {change} | {p} |")
    return head + "\n".join(rows) + "\n"


def type_table(before: list[dict], after: list[dict]) -> str:
    """Markdown: right answers per problem type of the generated levels (records with a `template`), before and
    after on the same problems; "" when no record has a type (problems from files).

    >>> rec = lambda i, ok: {"id": i, "difficulty": "basic", "template": "_ has _ ...", "correct": ok}
    >>> print(type_table([rec(1, False), rec(2, True)], [rec(1, True), rec(2, True)]))
    | level | problem type | n | right before | right after |
    |---|---|---|---|---|
    | basic | _ has _ ... | 2 | 1 (50%) | 2 (100%) |
    <BLANKLINE>
    """
    after_by_id = {r["id"]: r for r in after}
    counts: dict[tuple[str, str], list[int]] = {}
    for r in before:
        if r.get("template") and r["id"] in after_by_id:
            c = counts.setdefault((r["difficulty"], r["template"]), [0, 0, 0])
            c[0], c[1], c[2] = c[0] + 1, c[1] + bool(r["correct"]), c[2] + bool(after_by_id[r["id"]]["correct"])
    if not counts:
        return ""
    head = "| level | problem type | n | right before | right after |\n|---|---|---|---|---|\n"
    return head + "\n".join(f"| {level} | {kind} | {n} | {b} ({100 * b / n:.0f}%) | {a} ({100 * a / n:.0f}%) |"
                            for (level, kind), (n, b, a) in counts.items()) + "\n"
