"""Rollouts through llama.cpp (issue 70, candidate b) against the packed bf16 sampler, on the default profile's job.

    flock runs/.cpu.lock .venv/bin/python bench/llamacpp_rollout.py        # alone on the CPU; needs llama-cpp-python
    .venv/bin/python bench/llamacpp_rollout.py --cells 8x8x256 --reps 2

The default profile's model and LoRA (Qwen2.5-Coder-0.5B-Instruct, r 16, all linear layers; B drawn at random so that
the adapter changes the logits as a trained one does) on GSM8K test prompts, G samples each, at the profile's
temperature, sampled two ways from the same prompts:
- bf16: this project's sampler (engine/sampler.py: oneDNN-packed bf16 matmuls, the adapters beside them);
- llama.cpp: the base written once as a q8_0 GGUF (export/gguf.py), the LoRA as a GGUF adapter (what would be
  written after each optimizer step), every row of a step decoded as one llama.cpp batch (one KV stream a row,
  a group's prompt prefilled once and copied), sampled here from its logits.
Per way: tokens/s (the tokens the rows wrote over the seconds); for llama.cpp also the refresh a step would pay
(writing the adapter, loading it, setting it), and the mismatch with the trainer: the trainer's log-probs of
llama.cpp's tokens (engine.batching.group_logprobs, as the update computes them) against llama.cpp's own, as the
step log's sampler_kl (k1, per token) and sampler_far_frac (tokens whose ratio leaves [1/3, 3]).
The first repetition warms up; the medians of the rest are reported.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from cpu_grpo import config
from cpu_grpo.data import loaders
from cpu_grpo.engine.batching import group_logprobs
from cpu_grpo.engine.llamacpp import isolated
from cpu_grpo.engine.prompts import encode_prompts
from cpu_grpo.engine.threads import set_threads
from cpu_grpo.export import gguf as gguf_export
from cpu_grpo.export.gguf_arch import gguf_name


def write_base(model_dir: Path, path: Path, tok) -> None:
    """The base model (no adapter) as a q8_0 GGUF, written by this project's exporter."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gguf_export.write(base, tok, model_dir, path, "q8_0", "bench-base", None, log=lambda *a: None)


def write_adapter(model, path: Path) -> None:
    """The model's LoRA adapters as a llama.cpp LoRA GGUF (convert_lora_to_gguf.py's layout: A (r, in), B (out, r),
    adapter.lora.alpha)."""
    import gguf

    cfg = model.base_model.model.config
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    alpha = None
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            hf = name.split("base_model.model.", 1)[1] + ".weight"
            target = gguf_name(hf, cfg.num_hidden_layers, "qwen2")
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            alpha = module.scaling["default"] * a.shape[0]
            w.add_tensor(f"{target}.lora_a", a.detach().float().numpy())
            w.add_tensor(f"{target}.lora_b", b.detach().float().numpy())
    w.add_float32("adapter.lora.alpha", float(alpha))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mismatch(run, prompts, comps, logps, g: int) -> dict:
    """The trainer's log-probs of the sampled tokens against the sampler's: k1 KL per token, share of far ratios."""
    diffs = []
    with torch.no_grad():
        for i in range(len(prompts)):  # 4 rows at a time, as the update's micro-batches: (rows, T, vocab) logits
            for j in range(0, g, 4):
                samples = tuple(range(j, min(g, j + 4)))
                trainer, _ = group_logprobs(run.model, prompts, comps, [i], g, run.tok.pad_token_id,
                                            run.cfg.temperature, run.autocast, samples=samples)
                for k, row in zip(samples, trainer.tolist(), strict=True):
                    diffs += [s - t for s, t in zip(logps[i * g + k], row[:len(logps[i * g + k])], strict=True)]
    return {"kl": statistics.mean(diffs), "far": sum(abs(d) > math.log(3) for d in diffs) / len(diffs)}


def policy(output_dir: str, lora_std: float):
    """The default profile's config and run, its LoRA B drawn at random (std `lora_std`, seed 0) so that the adapter
    changes the logits as a trained one does, the sampler refreshed with it."""
    from cpu_grpo.train import runstate

    cfg = config.build("default", None, {"output_dir": output_dir, "learning_rate": 1e-9})
    run, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    torch.manual_seed(0)
    for name, p in run.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, lora_std)
    run.sampler.refresh()
    return cfg, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=["8x8x256"], help="prompts x samples x new tokens")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--lora-std", type=float, default=0.002, help="the spread of the random LoRA B")
    args = ap.parse_args()
    threads = set_threads()
    cfg, run = policy("/tmp/bench-llamacpp", args.lora_std)
    from cpu_grpo.engine.models import resolve_model

    work = Path(tempfile.mkdtemp(prefix="bench-llamacpp-"))
    t = time.perf_counter()
    write_base(Path(resolve_model(cfg.model)), work / "base-q8_0.gguf", run.tok)
    base_s = time.perf_counter() - t
    problems = loaders.load_task("gsm8k", split="test")
    print(f"threads {threads}; {cfg.model}, LoRA r {cfg.lora_r} (B ~ N(0, {args.lora_std})); temperature "
          f"{cfg.temperature}; q8_0 base written once in {base_s:.0f} s "
          f"({(work / 'base-q8_0.gguf').stat().st_size / 2**20:.0f} MiB)\n")
    print("| prompts x samples x new tokens | way | tok/s | of bf16 | refresh a step (s) | tokens a row | "
          "sampler_kl | sampler_far_frac | seconds |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for cell in args.cells:
        b, g, new = map(int, cell.split("x"))
        lc = isolated(work / "base-q8_0.gguf", b * g, 1024, threads, batch=2048)  # as measured on 2026-12-04
        got = {"bf16": [], "llama.cpp": []}
        for r in range(args.reps + 1):
            chats = [ex.chat(cfg.instruction, cfg.system_prompt) for ex in problems[r * b:(r + 1) * b]]
            prompts = encode_prompts(run.tok, chats)
            t = time.perf_counter()
            comps = run.sampler.generate(prompts, g, run.sampling(new), torch.Generator().manual_seed(r))
            one = {"seconds": time.perf_counter() - t, "tokens": sum(map(len, comps))}
            t = time.perf_counter()
            write_adapter(run.model, work / "adapter.gguf")
            lc.set_adapter(work / "adapter.gguf")
            refresh = time.perf_counter() - t
            t = time.perf_counter()
            lcomps, logps = lc.generate(prompts, g, new, cfg.temperature, run.stops, torch.Generator().manual_seed(r))
            two = {"seconds": time.perf_counter() - t, "tokens": sum(map(len, lcomps)), "refresh": refresh,
                   **mismatch(run, prompts, lcomps, logps, g)}
            if r:
                got["bf16"].append(one)
                got["llama.cpp"].append(two)
        lc.close()
        bf16 = statistics.median(x["tokens"] / x["seconds"] for x in got["bf16"])
        for way, xs in got.items():
            rate = statistics.median(x["tokens"] / x["seconds"] for x in xs)
            llama = way == "llama.cpp"
            refresh = f"{statistics.median(x['refresh'] for x in xs):.2f}" if llama else "-"
            kl, far = (f"{statistics.mean(x[k] for x in xs):.4f}" if llama else "-" for k in ("kl", "far"))
            print(f"| {cell} | {way} | {rate:.0f} | {rate / bf16:.2f}x | {refresh} | "
                  f"{statistics.mean(x['tokens'] for x in xs) / (b * g):.0f} | {kl} | {far} | "
                  f"{statistics.median(x['seconds'] for x in xs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
