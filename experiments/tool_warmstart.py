"""Issue 69's first stage (results/agent-gsm8k/PLAN.md): a supervised warm start that shows the default model the
calculator's call, from GSM8K's own calculator annotations, and the same solutions in text for the arm without it.

    flock runs/.cpu.lock .venv/bin/python experiments/tool_warmstart.py calculator runs/agent-gsm8k-warm-calculator
    flock runs/.cpu.lock .venv/bin/python experiments/tool_warmstart.py text runs/agent-gsm8k-warm-text

GSM8K's training solutions mark each calculation (`48/2 = <<48/2=24>>24`). Arm `calculator` turns each mark into a
call: the text before it, a call of the calculator with its expression, the tool's result, and the text after it
(which opens with the result). The call is JSON in a code fence, the form this model writes when offered tools
(data/tools.py reads it): taught in its template's `<tool_call>` tags (2026-12-05, first try), the model wrote the
JSON right and a junk token (`ﱐ`, `柳`) where each tag goes, 0 of 32 calls read: in this coder model the tags are
tokens its training hardly saw. arm `text` is the same solution with the marks removed, word for word what the
calculator arm writes. Both end in `\\boxed{answer}`. The first N training problems whose every mark the
calculator reproduces, with 1-4 marks and at most 256 completion tokens, are the demonstrations of both arms.
The default profile's LoRA is trained on the model's tokens only (tools' results and the template masked), one
pass, then merged and saved as a model directory that `cpu-grpo train --model DIR` takes. Then, on 8 other training
problems x 4 samples at the profile's temperature: rows that call the calculator, calls that ran, rows right.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from fractions import Fraction
from pathlib import Path

import torch

from cpu_grpo import config
from cpu_grpo.data import loaders
from cpu_grpo.data.rewards import correctness_reward
from cpu_grpo.data.tools import calculator, schemas
from cpu_grpo.engine import agent
from cpu_grpo.engine.threads import set_threads

SYSTEM = {"calculator": "Solve the math problem. For each calculation call the calculator tool, then put your final "
                        "answer within \\boxed{}.",
          "text": "Solve the math problem. Write each calculation, then put your final answer within \\boxed{}."}
MARK = re.compile(r"<<([^=<>]*)=([^<>]*)>>")
BUDGET, MAX_CALLS = 256, 5
MICRO = 2  # sequences a forward pass


def worked(solution: str, answer: str, arm: str) -> list[dict] | None:
    """The assistant's (and the tools') turns that work `solution`, or None where a mark is not one the calculator
    reproduces."""
    body = solution.rsplit("####", 1)[0].strip()
    marks = list(MARK.finditer(body))
    if not 1 <= len(marks) <= MAX_CALLS - 1:
        return None
    turns, start = [], 0
    for m in marks:
        try:
            result = calculator(m.group(1))
            if Fraction(result.replace(",", "")) != Fraction(m.group(2).replace(",", "")):
                return None
        except (ValueError, SyntaxError, ZeroDivisionError, TypeError):
            return None
        call = json.dumps({"name": "calculator", "arguments": {"expression": m.group(1)}})
        turns += [{"role": "assistant", "content": f"{body[start:m.start()].strip()}\n```json\n{call}\n```"},
                  {"role": "tool", "content": result}]
        start = m.end()
    end = f"{body[start:].strip()}\n\\boxed{{{answer}}}"
    if arm == "text":
        return [{"role": "assistant", "content": f"{MARK.sub('', body)}\n\\boxed{{{answer}}}"}]
    return turns + [{"role": "assistant", "content": end}]


def tokens(tok, chat: list[dict], tools: list[dict]) -> tuple[list[int], list[int]]:
    """The conversation's tokens and which of them the model writes (its turns, each up to its end-of-turn)."""
    def ids(messages, open_turn):
        text = tok.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=open_turn)
        return tok(text, add_special_tokens=False)["input_ids"]

    full = ids(chat, False)
    mask = [0] * len(full)
    for k, m in enumerate(chat):
        if m["role"] == "assistant":
            start, end = len(ids(chat[:k], True)), len(ids(chat[:k + 1], False))
            while full[end - 1] != tok.convert_tokens_to_ids("<|im_end|>"):
                end -= 1
            mask[start:end] = [1] * (end - start)
    return full, mask


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arm", choices=sorted(SYSTEM))
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=128, help="demonstrations")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    args = ap.parse_args()
    threads = set_threads()
    torch.manual_seed(0)
    from cpu_grpo.train import runstate

    cfg = config.build("default", None, {"output_dir": "/tmp/tool-warmstart", "learning_rate": args.lr})
    run, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    tools = schemas([calculator]) if args.arm == "calculator" else []
    problems = loaders.load_task("gsm8k", split="train")
    demos = []
    for i, ex in enumerate(problems[:2000]):
        turns = worked(ex.solution, ex.answer, "calculator")
        if turns is None:
            continue
        chat = [{"role": "system", "content": SYSTEM[args.arm]}, {"role": "user", "content": ex.question}]
        with_calls, _ = calls = tokens(run.tok, chat + turns, schemas([calculator]))  # both arms: these problems
        ids, mask = calls if args.arm == "calculator" else tokens(run.tok, chat + worked(ex.solution, ex.answer,
                                                                                           "text"), tools)
        if len(with_calls) - len(agent.prompt_ids(run.tok, chat, schemas([calculator]))) <= BUDGET:
            demos.append((i, ids, mask))
        if len(demos) == args.n:
            break
    print(f"threads {threads}; {cfg.model}; arm {args.arm}; {len(demos)} demonstrations (GSM8K train problems "
          f"{demos[0][0]}-{demos[-1][0]}), {sum(sum(m) for _, _, m in demos)} trained tokens; LoRA r {cfg.lora_r}, "
          f"lr {args.lr}, batch {args.batch}, one pass", flush=True)
    params = [p for p in run.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    pad = run.tok.pad_token_id
    run.model.train()
    for step, b in enumerate(range(0, len(demos), args.batch)):
        t = time.perf_counter()
        part = demos[b:b + args.batch]
        tokens_trained = sum(sum(m[1:]) for _, _, m in part)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(0, len(part), MICRO):  # the logits of a whole batch (151,936 a token) do not fit in 24 GB
            total += backward(run, part[k:k + MICRO], pad, tokens_trained)
        opt.step()
        print(f"step {step + 1}/{-(-len(demos) // args.batch)}: loss {total:.3f} "
              f"({time.perf_counter() - t:.0f} s)", flush=True)
    run.model.eval()
    try:  # a failed check is said, and the trained model is kept
        check(run, cfg, problems[2000:2008], args.arm)
    except Exception as e:  # noqa: BLE001
        print(f"the check failed: {type(e).__name__}: {e}")
    merged = run.model.merge_and_unload()
    merged.save_pretrained(args.out)
    run.tok.save_pretrained(args.out)
    print(f"saved: {args.out}")


def backward(run, part: list, pad: int, tokens_trained: int) -> float:
    """The mean negative log-likelihood of the model's tokens in `part`, its share of the batch's, backpropagated."""
    width = max(len(ids) for _, ids, _ in part)
    ids = torch.tensor([x + [pad] * (width - len(x)) for _, x, _ in part])
    mask = torch.tensor([m + [0] * (width - len(m)) for _, _, m in part], dtype=torch.float)
    real = (torch.arange(width)[None] < torch.tensor([len(x) for _, x, _ in part])[:, None]).long()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=run.autocast):
        logits = run.model(input_ids=ids, attention_mask=real).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    loss = (nll * mask[:, 1:]).sum() / tokens_trained
    loss.backward()
    return loss.item()


def check(run, cfg, problems, arm: str, g: int = 4) -> None:
    """Sample the trained model on problems it was not shown: calls, calls that ran, rows right."""
    run.sampler.refresh()
    rows = [[{"role": "system", "content": SYSTEM[arm]}, {"role": "user", "content": ex.question}]
            for ex in problems for _ in range(g)]
    tools = [[calculator] if arm == "calculator" else [] for _ in rows]
    sampling = run.sampling(BUDGET)
    generate = agent.generating(run.sampler, sampling, torch.Generator().manual_seed(0))
    _, turns = agent.sample_with_tools(run.tok, generate, rows, g, tools, BUDGET, MAX_CALLS, sampling.stops)
    answers = [ex.answer for ex in problems for _ in range(g)]
    right = correctness_reward([str(t.messages[-1].get("content", "")) for t in turns], answers)
    print(f"check on {len(problems)} other training problems x {g}: rows with a call {sum(t.calls > 0 for t in turns)}"
          f"/{len(turns)}, calls {sum(t.calls for t in turns)}, failed {sum(t.failed for t in turns)}, "
          f"rows right {int(sum(right))}")
    for t in turns[:2]:
        print("    " + repr(" | ".join(f"{m['role']}: {str(m.get('content'))[:120]}" for m in t.messages)))


if __name__ == "__main__":
    main()
