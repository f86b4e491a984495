"""Multi-turn rollouts with tools against single-turn ones, on the default profile's sampler (issue 69, item 3).

    flock runs/.cpu.lock .venv/bin/python bench/multiturn.py          # alone on the CPU
    .venv/bin/python bench/multiturn.py --cells 8x8x256 --reps 2
    .venv/bin/python bench/multiturn.py --model runs/agent-gsm8k-warm-calculator --instruction "" \
        --system-prompt "TEXT"   # a warm start that calls tools; TEXT: experiments/tool_warmstart.py's SYSTEM

The default profile's model and sampler (Qwen2.5-Coder-0.5B-Instruct, LoRA sampled unmerged, bf16) on GSM8K test
problems, G samples each, at the profile's temperature, with a system turn that asks for the calculator (SYSTEM), in
three ways, each from the same generator seed:
- single: the plain prompt, one turn (what a run without tools samples);
- multi-turn: the prompt with the builtin calculator, one sampler call in which a row whose turn ends in a tool
  call gets its result fed into its own KV cache and writes on (engine/conversation.py);
- in rounds: the same conversations sampled the way before it, every live row prefilled again from its prompt and
  its conversation so far each round, a round waiting for its slowest row (conversation.in_rounds).
Tokens/s counts the tokens the model wrote (`model tok/s`) and all of a completion's (`all tok/s`: the tool results
and headers given to it too). The first repetition warms up; the medians of the rest are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

from cpu_grpo import config
from cpu_grpo.data import loaders
from cpu_grpo.data.tools import calculator
from cpu_grpo.engine import agent
from cpu_grpo.engine.conversation import in_rounds
from cpu_grpo.engine.prompts import encode_prompts
from cpu_grpo.engine.threads import set_threads
from cpu_grpo.machine.allocator import keep_freed_memory

MODES = ("single", "multi-turn", "in rounds")
# the system turn of every mode: a model that never calls a tool would measure one turn three times
SYSTEM = "Use the calculator tool for every arithmetic step."


def sample(run, mode: str, chats, g: int, new: int, seed: int, max_calls: int) -> dict:
    sampling, gen = run.sampling(new), torch.Generator().manual_seed(seed)
    t = time.perf_counter()
    if mode == "single":
        comps = run.sampler.generate(encode_prompts(run.tok, chats), g, sampling, gen)
        written, calls = sum(len(c) for c in comps), 0
        given = 0
    else:
        def once(prompts, k, limit):
            return run.sampler.generate(prompts, k, dataclasses.replace(sampling, max_new_tokens=limit), gen)

        generate = agent.generating(run.sampler, sampling, gen) if mode == "multi-turn" else \
            (lambda prompts, k, conversation: in_rounds(once, prompts, k, new, sampling.stops, conversation))
        rows = [c for c in chats for _ in range(g)]
        _, turns = agent.sample_with_tools(run.tok, generate, rows, g, [[calculator]] * len(rows), new, max_calls,
                                           sampling.stops)
        written = sum(sum(t.model_mask) for t in turns)
        given, calls = sum(len(t.ids) for t in turns) - written, sum(t.calls for t in turns)
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "written": written, "given": given, "calls": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=["8x8x256"], help="prompts x samples x new tokens")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-calls", type=int, default=5)
    ap.add_argument("--system-prompt", default=SYSTEM, help="the system turn of every mode ('' for none)")
    ap.add_argument("--model", help="a model directory in place of the profile's (e.g. a warm start that calls tools)")
    ap.add_argument("--instruction", help="the line after each problem in place of the profile's ('' for none)")
    ap.add_argument("--threads", type=int, help="PyTorch threads (default: one per core other work leaves free)")
    args = ap.parse_args()
    threads = set_threads(args.threads)
    keep_freed_memory()
    from cpu_grpo.train import runstate

    given = {"model": args.model, "instruction": args.instruction}
    cfg = config.build("default", None, {"output_dir": "/tmp/bench-multiturn", "learning_rate": 1e-9,
                                         "system_prompt": args.system_prompt,
                                         **{k: v for k, v in given.items() if v is not None}})
    run, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    problems = loaders.load_task("gsm8k", split="test")
    print(f"threads {threads}; {cfg.model}, LoRA r {cfg.lora_r}, sampled {run.sampler.dtype} "
          f"({'unmerged' if run.sampler.unmerged else 'copy'}); GSM8K test problems; temperature {cfg.temperature}; "
          f"system turn {cfg.system_prompt!r}\n")
    print("| prompts x samples x new tokens | mode | model tok/s | all tok/s | of single (model tok/s) | "
          "tokens written a row | given a row | tool calls a row | seconds |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for cell in args.cells:
        b, g, new = map(int, cell.split("x"))
        got = {m: [] for m in MODES}
        for r in range(args.reps + 1):
            chats = [ex.chat(cfg.instruction, cfg.system_prompt) for ex in problems[r * b:(r + 1) * b]]
            for mode in MODES:  # the same problems and seed in each mode
                one = sample(run, mode, chats, g, new, seed=r, max_calls=args.max_calls)
                if r:
                    got[mode].append(one)
        single = statistics.median(x["written"] / x["seconds"] for x in got["single"])
        for mode in MODES:
            xs, rows = got[mode], b * g
            model = statistics.median(x["written"] / x["seconds"] for x in xs)
            every = statistics.median((x["written"] + x["given"]) / x["seconds"] for x in xs)
            print(f"| {cell} | {mode} | {model:.0f} | {every:.0f} | {model / single:.2f}x | "
                  f"{statistics.mean(x['written'] for x in xs) / rows:.0f} | "
                  f"{statistics.mean(x['given'] for x in xs) / rows:.0f} | "
                  f"{statistics.mean(x['calls'] for x in xs) / rows:.2f} | "
                  f"{statistics.median(x['seconds'] for x in xs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
