"""What an export costs: file size, write time and held-out accuracy of a run's checkpoint exported to GGUF.

    python bench/export_table.py RUN_DIR [RUN_DIR ...] [--quants q8_0 q4_0] [--n 200] [--output FILE.md]

For each run: the checkpoint (its newest good one) evaluated greedily on n of the run's held-out problems (the test
split, seed + 1), asked as the run asked (its instruction); each quantization written with `cpu-grpo export`
(--no-verify, timed) and read back with transformers' GGUF loader, evaluated on the same problems and paired with
the checkpoint (Newcombe's interval, McNemar's exact p); the first quantization also asked without the instruction
(the bare question through the checkpoint's own chat template), which is what the prompt in the template is worth.
Prints one markdown table; times are wall-clock on whatever else the machine was doing.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cpu_grpo.eval import stats  # noqa: E402
from cpu_grpo.export import source, verify  # noqa: E402
from cpu_grpo.export.run import Request, export  # noqa: E402


def _load_gguf(out: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = next(out.glob("*.gguf")).name
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file=name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out, gguf_file=name)
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    return model, tok


def _pct(records: list[dict]) -> str:
    return f"{sum(r['correct'] for r in records) / len(records):.1%}"


def _row(label: str, quant: str, size: int, seconds: float, ref: list[dict], mine: list[dict]) -> str:
    cmp = stats.paired_comparison([r["correct"] for r in ref], [r["correct"] for r in mine])
    lo, hi = cmp["ci95"]
    same = sum(a["completion"] == b["completion"] for a, b in zip(ref, mine, strict=True))
    return (f"| {label} | {quant} | {size / 2**20:.0f} MiB | {seconds:.0f} s | {_pct(ref)} | {_pct(mine)} | "
            f"{cmp['diff'] * 100:+.1f} ({lo * 100:+.1f} to {hi * 100:+.1f}), p = {cmp['p_value']:.2g} | "
            f"{same}/{len(ref)} |")


def measure(run: str, quants: list[str], n: int, log=print) -> list[str]:
    src = source.find(run, log)
    shape, limit = (src.instruction, src.system), int(src.cfg.get("eval_max_new_tokens", 256))
    examples, judge = source.held_out(src, n), source.judge(src, limit)
    model, tok = source.load(src, log)
    t0 = time.time()
    ref = verify.answers(verify.greedy(model, tok, limit), tok, tok.chat_template, examples, shape, log,
                         judge=judge)
    log(f"checkpoint: {_pct(ref)} in {time.time() - t0:.0f} s")
    label, rows = f"{src.cfg.get('model')} ({Path(run).name}, step {src.step})", []
    with tempfile.TemporaryDirectory() as tmp:
        for i, quant in enumerate(quants):
            out = Path(tmp) / quant
            result = export(Request(spec=run, format="gguf", quant=quant, out=str(out), verify=False), log)
            gguf_size = next(v for k, v in result.files.items() if k.endswith(".gguf"))
            written, wtok = _load_gguf(out)
            mine = verify.answers(verify.greedy(written, wtok, limit), wtok, wtok.chat_template, examples, shape,
                                  log, judge=judge)
            rows.append(_row(label, quant, gguf_size, result.seconds, ref, mine))
            if i == 0:  # the same file asked the bare question through the checkpoint's own template
                bare = verify.answers(verify.greedy(written, wtok, limit), wtok, tok.chat_template, examples,
                                      ("", src.system), log, judge=judge)
                rows.append(_row(label, f"{quant}, asked without the instruction", gguf_size, result.seconds, ref,
                                 bare))
            log(rows[-1])
            del written
    return rows


def table(rows: list[str], n: int, note: str = "") -> str:
    """The rows (`_row`) under their header and a line of when, where and n (and `note`)."""
    head = ["| model | GGUF | size | write | checkpoint | export | change, points (95% CI), McNemar | same text |",
            "|---|---|---:|---:|---:|---:|---|---:|"]
    return "\n".join([f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
                      f"{platform.processor() or platform.machine()}, n = {n}{note}", "", *head, *rows]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--quants", nargs="+", default=["q8_0", "q4_0"])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    rows = [r for run in args.runs for r in measure(run, args.quants, args.n, log=print)]
    text = table(rows, args.n)
    print(text)
    if args.output:
        Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
