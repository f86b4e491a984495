"""The planner against measurement: predicted and measured seconds per step and peak RSS, one set of configurations.

    .venv/bin/python bench/planner.py --set check   # the 8 configurations the constants were not fitted on
    .venv/bin/python bench/planner.py --set fit     # the 8 they were fitted on (measured 2026-11-24); ~15 minutes each
    .venv/bin/python bench/planner.py --set fresh   # 3 more, measured after the memory formula's last change
    .venv/bin/python bench/planner.py --set check --only 0 3
    .venv/bin/python bench/planner.py --set arch    # new architectures (random weights at their real width)
    .venv/bin/python bench/planner.py --run runs/default-fast-seed0 --machine 170 332 105  # a finished run

Each configuration trains for --steps steps in its own process (its peak RSS is its own) with every completion
at the token limit (no stop token) and a pseudo-random reward (no group skipped), which is what the planner
predicts; the last step's seconds are compared with `planner.predict` for the machine measured at the start.
Prints one markdown table: predicted, measured, and the error of each.

--run: a real run's steps against the planner, stage by stage: the likely forecast (what `cpu-grpo plan` and the
run's start print) and the forecast at the completion lengths, batches and trained groups each step had; the
machine as the run's start printed it (--machine BF16 FP32 GB/S) or measured now.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

SETS = {  # (model, LoRA, prompts, samples, new tokens)
    "fit": [  # planner.EFFICIENCY's decode constants are fitted to these (the measurements of 2026-11-24)
        ("smollm2-135m", False, 4, 4, 64),
        ("smollm2-135m", False, 8, 8, 96),
        ("smollm2-135m", False, 4, 8, 128),
        ("smollm2-135m", True, 8, 8, 96),
        ("smollm2-135m", True, 4, 4, 256),
        ("qwen2.5-coder-0.5b", True, 2, 8, 128),
        ("qwen2.5-coder-0.5b", True, 4, 8, 256),
        ("qwen2.5-coder-0.5b", False, 2, 4, 64),
    ],
    "check": [  # other shapes, never fitted on
        ("smollm2-135m", False, 2, 8, 64),
        ("smollm2-135m", False, 8, 4, 128),
        ("smollm2-135m", False, 2, 16, 96),
        ("smollm2-135m", True, 4, 8, 192),
        ("smollm2-135m", True, 2, 4, 128),
        ("qwen2.5-coder-0.5b", True, 2, 4, 192),
        ("qwen2.5-coder-0.5b", True, 4, 4, 128),
        ("qwen2.5-coder-0.5b", False, 1, 4, 96),
    ],
    "fresh": [  # after the memory formula's correction (2026-11-24), shapes neither set had
        ("qwen2.5-coder-0.5b", True, 2, 8, 96),
        ("qwen2.5-coder-0.5b", True, 1, 8, 256),
        ("smollm2-135m", True, 8, 4, 96),
    ],
    "arch": [  # architectures added after the constants were fitted: random weights at the real width, fewer layers
        ("random:qwen3:8", False, 4, 8, 96),
        ("random:qwen3:8", True, 4, 8, 128),
        ("random:gemma3_text:6", False, 4, 8, 96),
    ],
}


def model_path(spec: str) -> str:
    """An alias or path as it is; "random:ARCH:LAYERS": a random model of ARCH at its real width
    (bench/architectures.py) with LAYERS layers and the default model's tokenizer, built once in the temp directory."""
    if not spec.startswith("random:"):
        return spec
    _, arch, layers = spec.split(":")
    where = Path(tempfile.gettempdir()) / "cpu-grpo-bench" / f"{arch}-{layers}"
    if not (where / "config.json").is_file():
        import torch
        from architectures import configs
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cpu_grpo.engine.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model("qwen2.5-coder-0.5b", log=lambda *a: None))
        cfg = configs(int(layers))[arch][1]
        cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(where)
        tok.save_pretrained(where)
    return str(where)


def varied_reward(completions, **kwargs) -> list[float]:
    return [(zlib.crc32(str(c).encode()) % 1000) / 1000 for c in completions]


def fields(config: tuple, steps: int, out: str) -> dict:
    model, lora, b, g, t = config
    return dict(model=model_path(model), use_lora=lora, prompts_per_step=b, num_generations=g, max_new_tokens=t,
                steps=steps,
                task="basic", train_size=64, eval_size=0, save_every=0, learning_rate=1e-6, output_dir=out,
                score_truncated=True,  # every completion is cut at the limit here: score it, or no group trains
                rewards=[f"{Path(__file__).resolve()}:varied_reward"], reward_weights=[1.0])


def child(config: tuple, steps: int) -> dict:
    from cpu_grpo.config import build
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train import runstate
    from cpu_grpo.train.loop import train

    runstate.stop_ids = lambda tok, model: ()  # no stop token: every completion has max_new_tokens
    with tempfile.TemporaryDirectory(prefix="planner_") as tmp:
        rows = read_jsonl(train(build(None, None, fields(config, steps, str(Path(tmp) / "run"))),
                                log=lambda *a: print(*a, file=sys.stderr)) / "metrics.jsonl")
    last = rows[-1]
    return {"step": last["step_seconds"], "rollout": last["time_rollout"], "update": last["time_update"],
            "peak_gb": max(r["peak_rss_mb"] for r in rows) / 1024}


def run_table(run: Path, machine) -> str:
    """A finished run's steps against the planner, per stage (run_table's docstring: the module's, --run)."""
    import yaml

    from cpu_grpo.config import build
    from cpu_grpo.config.stages import plan
    from cpu_grpo.machine.planner import Shapes, predict, step_seconds
    from cpu_grpo.rundir import read_jsonl

    cfg = build(None, None, yaml.safe_load((run / "train_config.yaml").read_text()))
    shapes, stages = Shapes.of_model(cfg.model), plan(cfg)
    steps = [r for r in read_jsonl(run / "metrics.jsonl") if "step" in r]
    rows = ["| stage | steps | measured s/step (rollout + update) | at the run's lengths and groups | error |",
            "|---|---:|---:|---:|---:|"]
    total = {"measured": 0.0, "actual": 0.0}
    for i, stage in enumerate(stages):
        mine = [r for r in steps if r["stage_index"] == i]
        if not mine:
            continue
        c = dataclasses.replace(cfg, prompts_per_step=stage.prompts_per_step)
        measured = [(r["time_rollout"], r["time_update"]) for r in mine]
        actual = []
        for r in mine:  # the batches it sampled, the groups it trained, its mean completion length
            n, b = c.prompts_per_step, r.get("sample_batches", 1)
            batches = [n] * (b - 1) + [r["groups"] - n * (b - 1)]
            actual.append(step_seconds(c, shapes, machine, round(r["completion_len"]), batches,
                                       round(r["groups"] * (1 - r["frac_skipped"]))))
        m, a = (tuple(sum(x[j] for x in xs) / len(xs) for j in (0, 1)) for xs in (measured, actual))
        total["measured"] += sum(m) * len(mine)
        total["actual"] += sum(a) * len(mine)
        rows.append(f"| {stage.name} | {len(mine)} | {sum(m):.0f} ({m[0]:.0f} + {m[1]:.0f}) | {sum(a):.0f} "
                    f"({a[0]:.0f} + {a[1]:.0f}) | {sum(a) / sum(m) - 1:+.0%} |")
    likely = predict(cfg, shapes, machine, likely=True)
    peak = max(r["peak_rss_mb"] for r in steps) / 1024
    rows += ["", f"{len(steps)} steps: measured {total['measured']:.0f} s; at the run's lengths and groups "
                 f"{total['actual']:.0f} s ({total['actual'] / total['measured'] - 1:+.0%}); likely forecast "
                 f"{likely.step_s * len(steps):.0f} s ({likely.step_s * len(steps) / total['measured'] - 1:+.0%}). "
                 f"Peak RSS {peak:.2f} GiB, forecast {likely.peak_gb:.2f} ({likely.peak_gb / peak - 1:+.0%})."]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), default="check")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", type=int, nargs="*", default=None)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run", type=Path, help="a finished run's directory: its steps against the planner")
    ap.add_argument("--machine", type=float, nargs=3, metavar=("BF16", "FP32", "GBS"),
                    help="--run: the machine as the run's start printed it (default: measured now)")
    args = ap.parse_args()
    if args.run:
        from cpu_grpo.machine.planner import Machine

        bf16, fp32, gbs = args.machine or (0, 0, 0)
        machine = Machine(bf16, gbs, fp32_gflops=fp32) if args.machine else Machine.measure(2.0)
        print(f"{args.run}; machine: bf16 {machine.bf16_gflops:.0f} GFLOP/s, fp32 {machine.fp32_gflops:.0f}, "
              f"memory {machine.bandwidth_gbs:.0f} GB/s\n")
        print(run_table(args.run, machine))
        return
    if args.child is not None:
        with contextlib.redirect_stdout(sys.stderr):
            result = child(SETS[args.set][args.child], args.steps)
        print(json.dumps(result))
        return
    import os

    from cpu_grpo.config import build
    from cpu_grpo.machine.planner import Machine, Shapes, predict

    print(f"load average at the start: {os.getloadavg()[0]:.2f} (run it alone)")
    first = Machine.measure(2.0)
    configs = SETS[args.set]
    todo = args.only if args.only is not None else range(len(configs))
    measured = {}
    for i in todo:
        out = subprocess.run([sys.executable, __file__, "--set", args.set, "--child", str(i), "--steps",
                              str(args.steps)],
                             capture_output=True, text=True, check=True)
        measured[i] = json.loads(out.stdout.strip().splitlines()[-1])
    last = Machine.measure(2.0)  # twice, so that one disturbed measurement (a process still exiting) shows
    machine = max(first, last, key=lambda m: m.bf16_gflops)
    for name, m in (("start", first), ("end", last)):
        print(f"machine at the {name}: bf16 {m.bf16_gflops:.0f} GFLOP/s, copy {m.bandwidth_gbs:.1f} GB/s")
    print(f"predictions with the faster: {machine.bf16_gflops:.0f} GFLOP/s; the {args.set} set\n")
    print("| model | training | B x G x T | predicted s/step (rollout + update) | measured | error | predicted peak "
          "| measured | error |\n|---|---|---|---:|---:|---:|---:|---:|---:|")
    for i in todo:
        model, lora, b, g, t = configs[i]
        cfg = build(None, None, fields(configs[i], args.steps, "unused"))
        p = predict(cfg, Shapes.of_model(cfg.model), machine)
        m = measured[i]
        print(f"| {model} | {'LoRA' if lora else 'full'} | {b}x{g}x{t} | {p.step_s:.1f} ({p.rollout_s:.1f} + "
              f"{p.update_s:.1f}) | {m['step']:.1f} ({m['rollout']:.1f} + {m['update']:.1f}) | "
              f"{p.step_s / m['step'] - 1:+.0%} | {p.peak_gb:.2f} GB | {m['peak_gb']:.2f} GB | "
              f"{p.peak_gb / m['peak_gb'] - 1:+.0%} |", flush=True)

if __name__ == "__main__":
    main()
