"""How often the default model calls the calculator under a few system turns (results/agent-gsm8k/PLAN.md).

    flock runs/.cpu.lock .venv/bin/python experiments/tool_prompt_probe.py    # alone on the CPU
    .venv/bin/python experiments/tool_prompt_probe.py "the call shown"     # some of them (alone too)

The default profile's model and sampler (Qwen2.5-Coder-0.5B-Instruct + LoRA, bf16, temperature 0.7) on 8 GSM8K
*train* problems (the prompt is chosen without the test set), 4 samples each, 256 tokens for the whole
conversation, the builtin calculator offered through the chat template; per system turn: rows that call a tool,
calls, failed calls, rows whose last turn boxes an answer, and two transcripts.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cpu_grpo import config
from cpu_grpo.data import loaders
from cpu_grpo.data.rewards import correctness_reward
from cpu_grpo.data.tools import calculator
from cpu_grpo.engine import agent
from cpu_grpo.engine.threads import set_threads
from cpu_grpo.profiles import BOXED_INSTRUCTION

SYSTEM_TURNS = {  # system turn, instruction after the question
    "ask + boxed instruction": ("Use the calculator tool for every arithmetic step.", BOXED_INSTRUCTION),
    "solve, calculator, box": ("Solve the math problem. Use the calculator tool for every arithmetic step. Put your "
                               "final answer within \\boxed{}.", ""),
    "call first, then box": ("You are a math assistant with a calculator tool. First call the calculator with the "
                             "expression that answers the question, then give the final answer within \\boxed{}.", ""),
    "the call shown": ("Solve the math problem. For each calculation call the calculator tool, exactly like this:\n"
                       '```json\n{"name": "calculator", "arguments": {"expression": "(3 + 4) * 12"}}\n```\n'
                       "Then put your final answer within \\boxed{}.", ""),
    "a worked example": ("Solve the math problem. For each calculation call the calculator tool, then put your final "
                         "answer within \\boxed{}.", ""),
}
# a solved problem shown before the question, as chat turns in the template's own tool format (a few-shot prompt)
EXAMPLE = [
    {"role": "user", "content": "A baker makes 14 trays of 12 rolls and sells all but 9 rolls. How many does he sell?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "14 * 12 - 9"}}}]},
    {"role": "tool", "content": "159"},
    {"role": "assistant", "content": "He makes 14 * 12 = 168 rolls and sells 168 - 9 = 159.\n\\boxed{159}"},
]


def main() -> None:
    import sys

    from cpu_grpo.train import runstate

    threads = set_threads()
    cfg = config.build("default", None, {"output_dir": "/tmp/tool-prompt-probe", "learning_rate": 1e-9})
    run, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    problems = loaders.load_task("gsm8k-train", split="train")[:8]
    g, new = 4, 256
    print(f"threads {threads}; {cfg.model}; 8 GSM8K train problems x {g} samples, {new} tokens, temperature "
          f"{cfg.temperature}\n")
    for name, (system, instruction) in SYSTEM_TURNS.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        shown = EXAMPLE if name == "a worked example" else []
        rows = [[c[0], *shown, *c[1:]] for ex in problems for c in [ex.chat(instruction, system)] for _ in range(g)]
        sampling = run.sampling(new)
        _, turns = agent.sample_with_tools(run.tok, agent.generating(run.sampler, sampling,
                                                                     torch.Generator().manual_seed(0)),
                                           rows, g, [[calculator]] * len(rows), new, 5, sampling.stops)
        calls = [t.calls for t in turns]
        boxed = sum("\\boxed" in str(t.messages[-1].get("content", "")) for t in turns)
        print(f"== {name}: rows with a call {sum(c > 0 for c in calls)}/{len(turns)}, calls {sum(calls)}, failed "
              f"{sum(t.failed for t in turns)}, last turn boxed {boxed}", flush=True)
        own = sum(c["function"]["name"] == "calculator" and c["function"]["arguments"].get("expression") not in
                  ("(3 + 4) * 12", "14 * 12 - 9") for t in turns for m in t.messages for c in m.get("tool_calls", []))
        right = sum(correctness_reward([str(t.messages[-1].get("content", ""))], [ex.answer])[0] == 1
                    for t, ex in zip(turns, [ex for ex in problems for _ in range(g)], strict=True))
        print(f"   calls to the calculator with an expression of their own {own}; last turn right {right}")
        for t in turns[:2]:
            print("    " + repr(" | ".join(f"{m['role']}: {str(m.get('content'))[:150]}" for m in t.messages)))


if __name__ == "__main__":
    main()
