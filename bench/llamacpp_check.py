"""The exported GGUF run by llama.cpp itself (llama-cpp-python), against the checkpoint it came from.

    python bench/llamacpp_check.py RUN_DIR [--quants q8_0 q4_k_m] [--n 200] [--output FILE.md]

With --output, the per-problem records go beside it (FILE.jsonl.gz: id, answer, each side's prediction and
correctness, same text), enough to recompute every row.

`pip install llama-cpp-python` compiles llama.cpp from PyPI's source package (cmake and a C++ compiler; ~7 minutes
on 2 cores). For each quantization: `cpu-grpo export RUN --format gguf --quant Q` (unverified; the point here is
another reader), then llama.cpp loads the file and answers n of the run's held-out problems greedily through
`create_chat_completion`, which renders the chat template stored in the GGUF: each problem is sent as the bare
question, as a user of llama.cpp, LM Studio or Ollama would send it, so the run's instruction reaches the model
only if the exported template carries it. Scored as the run's evaluation scores, paired with the checkpoint's
greedy answers on the same problems (our sampler, bf16; Newcombe's interval, McNemar's exact p); "same text":
completions identical to the checkpoint's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from export_table import _row, table  # noqa: E402  (bench/export_table.py: a row, paired; the table)

from cpu_grpo.eval.metrics import score_completion  # noqa: E402
from cpu_grpo.export import source, verify  # noqa: E402
from cpu_grpo.export.run import Request, export  # noqa: E402


class Chat:
    """llama.cpp's own chat completion of a GGUF (in a child process: a crash in llama.cpp ends it, not the bench)."""

    def __init__(self, path: Path):
        from cpu_grpo.engine.llamacpp import high_level

        self.llm = high_level(path, n_ctx=2048, n_threads=os.cpu_count(), seed=0, verbose=False)

    def answer(self, question: str, limit: int) -> tuple[str, list[int]]:
        out = self.llm.create_chat_completion([{"role": "user", "content": question}], temperature=0.0,
                                              max_tokens=limit)
        text = out["choices"][0]["message"]["content"] or ""
        return text, self.llm.tokenize(text.encode(), add_bos=False, special=True)


def llama_answers(path: Path, examples: list, limit: int, judge, log=print) -> list[dict]:
    """Greedy completions by llama.cpp of each bare question, through the GGUF's own chat template."""
    from cpu_grpo.engine.isolated import Isolated

    texts, ids = [], []
    with Isolated("llama.cpp", Chat, path) as llm:
        for i, ex in enumerate(examples):
            text, tokens = llm.answer(ex.question, limit)
            texts.append(text)
            ids.append(tokens)
            if (i + 1) % 50 == 0:
                log(f"  llama.cpp {i + 1}/{len(examples)}")
    judged = judge.scores(examples, texts, ids, log)
    return [{"id": ex.id, "completion": text, "correct": bool(
        score_completion(text, ex.answer, ex.solution, False)["correct"] if right is None else right)}
        for ex, text, right in zip(examples, texts, judged, strict=True)]


def records(quant: str, examples: list, ref: list[dict], mine: list[dict]) -> list[dict]:
    """One line a problem: the answer, each side's prediction (the answer read from its text) and correctness."""
    def pred(r, ex):
        return score_completion(r["completion"], ex.answer, ex.solution, False)["pred"]

    return [{"quant": quant, "id": ex.id, "answer": ex.answer, "checkpoint_prediction": pred(a, ex),
             "checkpoint_correct": a["correct"], "export_prediction": pred(b, ex), "export_correct": b["correct"],
             "same_text": a["completion"] == b["completion"]} for ex, a, b in zip(examples, ref, mine, strict=True)]


def measure(run: str, quants: list[str], n: int, log=print) -> tuple[list[str], list[dict]]:
    src = source.find(run, log)
    shape, limit = (src.instruction, src.system), int(src.cfg.get("eval_max_new_tokens", 256))
    examples, judge = source.held_out(src, n), source.judge(src, limit)
    model, tok = source.load(src, log)
    ref = verify.answers(verify.greedy(model, tok, limit), tok, tok.chat_template, examples, shape, log,
                         judge=judge)
    label, rows, lines = f"{src.cfg.get('model')} ({Path(run).name}, step {src.step})", [], []
    del model
    with tempfile.TemporaryDirectory() as tmp:
        for quant in quants:
            out = Path(tmp) / quant
            result = export(Request(spec=run, format="gguf", quant=quant, out=str(out), verify=False), log)
            gguf = next(out.glob("*.gguf"))
            t0 = time.time()
            mine = llama_answers(gguf, examples, limit, judge, log)
            log(f"llama.cpp {quant}: {len(examples)} answers in {time.time() - t0:.0f} s")
            rows.append(_row(label, f"{quant}, llama.cpp, bare question", gguf.stat().st_size, result.seconds, ref,
                             mine))
            lines += records(quant, examples, ref, mine)
            log(rows[-1])
    return rows, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--quants", nargs="+", default=["q8_0", "q4_k_m"])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--output", default=None)
    args = p.parse_args()
    import llama_cpp

    rows, lines = measure(args.run, args.quants, args.n)
    text = table(rows, args.n, f", llama-cpp-python {llama_cpp.__version__}")
    print(text)
    if args.output:
        Path(args.output).write_text(text)
        with gzip.open(Path(args.output).with_suffix(".jsonl.gz"), "wt") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
