"""Rollouts through OpenVINO (issue 70, candidate c) against the packed bf16 sampler, on the default profile's job.

    python3 -m venv runs/ov && runs/ov/bin/pip install torch==2.13.0 transformers==5.25.0 "optimum-intel[openvino]" \
        peft gguf pyyaml psutil    # once: OpenVINO in an environment of its own, never the project's dependency
    PYTHONPATH=src flock runs/.cpu.lock runs/ov/bin/python bench/openvino_rollout.py    # alone on the CPU

The default profile's model and LoRA (Qwen2.5-Coder-0.5B-Instruct, r 16; B drawn at random, as in
bench/llamacpp_rollout.py) on GSM8K test prompts, G samples each, at the profile's temperature, sampled:
- bf16: this project's sampler (engine/sampler.py: oneDNN-packed bf16 matmuls, the adapters beside them);
- openvino bf16: the policy (adapters merged) exported to OpenVINO (optimum-intel), bf16 inference;
- openvino int8: the same with int8 weights per output channel (NNCF), OpenVINO's CPU plugin quantizing each
  token's activations to int8 on the fly (`DYNAMIC_QUANTIZATION_GROUP_SIZE`: VNNI's int8 dot products);
- openvino int8 weights only: the same with that quantization off (int8 weights, bf16 arithmetic).
Per way: tokens/s, the refresh a step would pay (merge, export, quantize, compile: OpenVINO holds no LoRA beside a
compiled model that optimum drives), and the mismatch with the trainer (the trainer's log-probs of the way's
tokens, as the update computes them, against the way's own: k1 KL a token, the share of ratios outside [1/3, 3]).
The first repetition warms up; the medians of the rest are reported. Alone on the CPU: numbers beside other work
are not a measure.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_rollout import mismatch, policy  # noqa: E402  (the same policy and measure as candidate b's)

from cpu_grpo.data import loaders  # noqa: E402
from cpu_grpo.engine.prompts import encode_prompts  # noqa: E402
from cpu_grpo.engine.threads import set_threads  # noqa: E402

WAYS = {"openvino bf16": (None, False), "openvino int8": (8, True), "openvino int8 weights only": (8, False)}


class Recorder:
    """A logits processor that keeps, for each row, the log-probability (at the sampling temperature) of the token
    it then sampled: the scores of one step are kept until the next call shows which token was taken."""

    def __init__(self, temperature: float, start: int):
        self.temperature, self.start, self.last, self.logps = temperature, start, None, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            taken = input_ids[:, -1:]
            got = self.last.gather(1, taken).squeeze(1).tolist()
            self.logps = self.logps or [[] for _ in got]
            for row, x in zip(self.logps, got, strict=True):
                row.append(x)
        self.last = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores


def export(model_dir: Path, out: Path, bits: int | None, threads: int, dq: bool):
    """The merged policy in `model_dir` as an OpenVINO model (int8 weights when bits=8), compiled for this CPU."""
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig

    quant = OVWeightQuantizationConfig(bits=8, sym=True) if bits == 8 else None
    ov_config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": str(threads),
                 "PERFORMANCE_HINT": "LATENCY", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "32" if dq else "0",
                 "CACHE_DIR": ""}
    model = OVModelForCausalLM.from_pretrained(model_dir, export=True, quantization_config=quant,
                                               load_in_8bit=bits == 8, ov_config=ov_config, compile=False)
    model.save_pretrained(out)
    model.compile()
    return model


def generate(model, tok, prompts: list[list[int]], g: int, new: int, temperature: float, seed: int, stops):
    """G samples of each prompt (left-padded into one batch), the tokens each row wrote (up to its stop) and their
    log-probs."""
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts for _ in range(g)])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts for _ in range(g)])[:, None])
    rec = Recorder(temperature, width)
    torch.manual_seed(seed)
    out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=temperature,
                         top_k=0, top_p=1.0, max_new_tokens=new, eos_token_id=list(stops),
                         pad_token_id=tok.pad_token_id, logits_processor=[rec])
    comps, logps = [], []
    for r, row in enumerate(out[:, width:].tolist()):
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        comps.append(row[:end])
        logps.append((rec.logps[r] if rec.logps else [])[:end])
    return comps, logps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="8x8x256", help="prompts x samples x new tokens")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--lora-std", type=float, default=0.002, help="the spread of the random LoRA B")
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS),
                    help="the OpenVINO ways (each export stays in memory: three of them passed 24 GB)")
    args = ap.parse_args()
    threads = set_threads()
    cfg, run = policy("/tmp/bench-openvino", args.lora_std)
    work = Path(tempfile.mkdtemp(prefix="bench-openvino-"))
    b, g, new = map(int, args.cell.split("x"))
    problems = loaders.load_task("gsm8k", split="test")
    import openvino

    print(f"threads {threads}; {cfg.model}, LoRA r {cfg.lora_r} (B ~ N(0, {args.lora_std})); temperature "
          f"{cfg.temperature}; OpenVINO {openvino.__version__}; cell {args.cell}\n")
    print("| way | tok/s | of bf16 | refresh a step (s) | tokens a row | sampler_kl | sampler_far_frac | seconds |")
    print("|---|---|---|---|---|---|---|---|", flush=True)

    def merged() -> Path:  # what a refresh would export: the policy with its adapters merged
        path = work / "merged"
        copy.deepcopy(run.model).merge_and_unload().save_pretrained(path)
        run.tok.save_pretrained(path)
        return path

    rows = {"bf16": []}
    for r in range(args.reps + 1):
        chats = [ex.chat(cfg.instruction, cfg.system_prompt) for ex in problems[r * b:(r + 1) * b]]
        prompts = encode_prompts(run.tok, chats)
        t = time.perf_counter()
        comps = run.sampler.generate(prompts, g, run.sampling(new), torch.Generator().manual_seed(r))
        if r:
            rows["bf16"].append({"seconds": time.perf_counter() - t, "tokens": sum(map(len, comps))})
    bf16 = statistics.median(x["tokens"] / x["seconds"] for x in rows["bf16"])
    _print("bf16", rows["bf16"], bf16, b * g)
    for way in args.ways:
        bits, dq = WAYS[way]
        t = time.perf_counter()
        model = export(merged(), work / way.replace(" ", "-"), bits, threads, dq)
        refresh = time.perf_counter() - t
        rows[way] = []
        for r in range(args.reps + 1):
            chats = [ex.chat(cfg.instruction, cfg.system_prompt) for ex in problems[r * b:(r + 1) * b]]
            prompts = encode_prompts(run.tok, chats)
            t = time.perf_counter()
            comps, logps = generate(model, run.tok, prompts, g, new, cfg.temperature, r, run.stops)
            seconds = time.perf_counter() - t
            if r:
                rows[way].append({"seconds": seconds, "tokens": sum(map(len, comps)), "refresh": refresh,
                                  **mismatch(run, prompts, comps, logps, g)})
        _print(way, rows[way], bf16, b * g)
        del model


def _print(way: str, xs: list[dict], bf16: float, n: int) -> None:
    rate = statistics.median(x["tokens"] / x["seconds"] for x in xs)
    refresh = f"{statistics.median(x['refresh'] for x in xs):.1f}" if "refresh" in xs[0] else "-"
    kl, far = (f"{statistics.mean(x[k] for x in xs):.4f}" if k in xs[0] else "-" for k in ("kl", "far"))
    print(f"| {way} | {rate:.0f} | {rate / bf16:.2f}x | {refresh} | {statistics.mean(x['tokens'] for x in xs) / n:.0f} "
          f"| {kl} | {far} | {statistics.median(x['seconds'] for x in xs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
