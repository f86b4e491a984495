"""Check an export against its checkpoint: the written files loaded back by transformers (and peft), not by us.

Exact formats (hf, peft, bf16/f16 GGUF): the prompts tokenized alike, greedy completions identical on held-out
prompts, and the largest logit difference, against the checkpoint's weights rounded as the file stores them (so that
any difference is the writer's fault, not the precision's) and, at each prompt's next token, against the unrounded
checkpoint. Quantized GGUF (q8_0, q4_k_m, q4_0): held-out accuracy of the exported model and the checkpoint on the same
problems, paired (Newcombe's interval, McNemar's exact p: eval.stats).
"""

from __future__ import annotations

import time

import torch

from ..eval import stats
from . import prompt


def _greedy(model, ids: list[list[int]], pad: int, stops: tuple[int, ...], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations of each prompt, batched with left padding, cut at the first stop token."""
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=list(stops), pad_token_id=pad, use_cache=True)
    result = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        result.append(row[:cut])
    return result


def _logits(model, seq: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float()  # (T, V)


def prompt_ids(tok, questions: list[str], template: str | None, instruction: str, system: str = "") -> list[list[int]]:
    return [tok(prompt.chat_prompt(tok, q, template, instruction, system), add_special_tokens=False)["input_ids"]
            for q in questions]


def round_to(model, dtype: torch.dtype | None, matrices_only: bool = False) -> None:
    """Round the model's weights to `dtype` in place (kept in fp32): what a file of that precision holds (a GGUF
    keeps vectors, norms and biases, in F32: `matrices_only`)."""
    if dtype is None:
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2 or not matrices_only:
                p.copy_(p.to(dtype).to(p.dtype))


def next_logits(ref, ref_tok, questions: list[str], shape: tuple[str, str]) -> list[torch.Tensor]:
    """The checkpoint's next-token logits after each prompt: taken before its weights are rounded (round_to)."""
    return [_logits(ref, p)[-1].clone() for p in prompt_ids(ref_tok, questions, ref_tok.chat_template, *shape)]


def greedy_check(ref, ref_tok, out, out_tok, questions: list[str], shape: tuple[str, str], out_template: str | None,
                 stops: tuple[int, ...], max_new_tokens: int, first: list[torch.Tensor], rounded_to: str) -> dict:
    """Compare greedy completions and logits of the exported model with the checkpoint's (see the module): `ref`
    rounded as the file stores it (`rounded_to`: round_to's dtype, or "none"), `first` its unrounded next-token
    logits (next_logits); `shape`: the run's (instruction, system prompt)."""
    ref_ids = prompt_ids(ref_tok, questions, ref_tok.chat_template, *shape)
    out_ids = prompt_ids(out_tok, questions, out_template, *shape)
    ref_done = _greedy(ref, ref_ids, ref_tok.pad_token_id, stops, max_new_tokens)
    out_done = _greedy(out, out_ids, ref_tok.pad_token_id, stops, max_new_tokens)
    diff = unrounded = 0.0
    for p, c, f in zip(ref_ids, ref_done, first, strict=True):  # one sequence at a time: (T, V) logits are large
        theirs = _logits(out, p + c)
        diff = max(diff, float((_logits(ref, p + c) - theirs).abs().max()))
        unrounded = max(unrounded, float((f - theirs[len(p) - 1]).abs().max()))
    same = [a == b for a, b in zip(ref_done, out_done, strict=True)]
    return {"kind": "greedy", "prompts": len(questions), "prompt_tokens_identical": ref_ids == out_ids,
            "identical": sum(same), "max_new_tokens": max_new_tokens, "max_logit_diff": diff,
            "max_logit_diff_unrounded": unrounded, "rounded_to": rounded_to,
            "first_difference": next((i for i, s in enumerate(same) if not s), None),
            "passed": ref_ids == out_ids and all(same)}


def greedy(model, tok, max_new_tokens: int):
    """Greedy completions by `model` (this project's sampler), as a function of the prompts' token ids."""
    from ..engine.sampler import Sampler, Sampling, stop_ids

    sampler, sampling = Sampler(model), Sampling(max_new_tokens, stop_ids(tok, model), tok.pad_token_id, 0.0)
    return lambda ids: sampler.generate(ids, 1, sampling)


ANSWER_BATCH = 50  # held-out problems `answers` asks at a time


def answers(generate, tok, template: str | None, examples: list, shape: tuple[str, str], log=print,
            batch: int = ANSWER_BATCH, judge=None) -> list[dict]:
    """Greedy completions of the held-out problems by `generate` (prompts' token ids to completions': greedy, or
    llama.cpp's in readback), asked in the run's shape through `template`, each scored as the run's evaluation scores
    it (`judge`, an eval.evaluate.Judge: a math row by its answer after '####', boxed, ...; a row of the run's own
    task by its correct reward)."""
    from ..eval.evaluate import Judge
    from ..eval.metrics import score_completion

    judge = judge or Judge()
    records, t0 = [], time.time()
    for i in range(0, len(examples), batch):
        part = examples[i:i + batch]
        outs = generate(prompt_ids(tok, [e.question for e in part], template, *shape))
        texts = [tok.decode(ids, skip_special_tokens=True) for ids in outs]
        judged = judge.scores(part, texts, outs, log)
        for ex, text, right in zip(part, texts, judged, strict=True):
            records.append({"id": ex.id, "completion": text, "correct": bool(
                score_completion(text, ex.answer, ex.solution, False)["correct"] if right is None else right)})
        each = (time.time() - t0) / len(records)
        log(f"  {len(records)}/{len(examples)}: {sum(r['correct'] for r in records) / len(records):.1%} right "
            f"({1 / each:.2f} problems/s, about {each * (len(examples) - len(records)):.0f} s left)")
    return records


def accuracy_check(mine, ref_tok, theirs, out_tok, out_template: str | None, examples: list,
                   shape: tuple[str, str], max_new_tokens: int, log=print, judge=None,
                   reader: str = "transformers") -> dict:
    """Greedy held-out accuracy of the checkpoint (`mine`) and the export (`theirs`, read by `reader`) on the same
    problems, paired (as `answers` generates and judges)."""
    log(f"evaluating the checkpoint on {len(examples)} held-out problems")
    ref = answers(mine, ref_tok, ref_tok.chat_template, examples, shape, log, judge=judge)
    log(f"evaluating the export on {len(examples)} held-out problems (read by {reader})")
    got = answers(theirs, out_tok, out_template, examples, shape, log, judge=judge)
    before, after = [r["correct"] for r in ref], [r["correct"] for r in got]
    cmp = stats.paired_comparison(before, after)
    worse = cmp["p_value"] < 0.05 and sum(after) < sum(before)
    return {"kind": "accuracy", "n": len(examples), "checkpoint": sum(before) / len(before),
            "export": sum(after) / len(after), "comparison": cmp, "max_new_tokens": max_new_tokens,
            "reader": reader,
            "same_answer": sum(a["completion"] == b["completion"] for a, b in zip(ref, got, strict=True)),
            "sentence": stats.significance_sentence(cmp, "export - checkpoint"), "passed": not worse}


# the largest logit difference llama.cpp may show, as a share of the checkpoint's largest logit: against its weights
# rounded as the file stores them (bf16, f16), or against the unrounded checkpoint (the quantized types). Seen: the
# tiny test models 0.4% (f16), 2.6% (bf16: llama.cpp rounds activations too), 10.8% (q8_0); real models' q8_0 files
# 1.3-7%; a llama3 file read with the default rope 52% (issue 72's tries)
LLAMA_CPP_TOLERANCE = {"bf16": 0.05, "f16": 0.01, "q8_0": 0.2, "q4_k_m": 0.4, "q4_0": 0.4}


def llama_cpp_check(ref, ref_tok, gguf_file, questions: list[str], shape: tuple[str, str], quant: str) -> dict:
    """Read the GGUF with llama.cpp itself (llama-cpp-python, in a child process: engine.llamacpp.isolated) and
    compare, on held-out prompts asked as the run asked them, its tokens with the checkpoint tokenizer's and its logits
    at every position with the checkpoint's (`ref` rounded as a bf16 or f16 file stores it: round_to, matrices only);
    a file llama.cpp cannot load fails, with llama.cpp's reason. A crash in llama.cpp raises NativeCrash."""
    from ..engine.llamacpp import isolated

    check = {"kind": "llama.cpp", "prompts": len(questions), "quant": quant}
    texts = [prompt.chat_prompt(ref_tok, q, ref_tok.chat_template, *shape) for q in questions]
    longest = max(len(ref_tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    try:  # a context as long as the longest prompt
        llm = isolated(gguf_file, 1, min(1024, longest + 8), torch.get_num_threads())
    except ValueError as e:  # llama.cpp's loader says why in its log
        return {**check, "passed": False, "error": f"llama.cpp cannot load the file ({str(e).splitlines()[0][:160]})"}
    worst, same_tokens, agree, total = 0.0, True, 0, 0
    with llm:
        for text in texts:
            ids = ref_tok(text, add_special_tokens=False)["input_ids"][:1000]
            same_tokens &= llm.tokenize(text)[:1000] == ids
            theirs, mine = torch.from_numpy(llm.logits(ids)).float(), _logits(ref, ids)
            worst = max(worst, float((theirs - mine).abs().max() / mine.abs().max()))
            agree, total = agree + int((theirs.argmax(-1) == mine.argmax(-1)).sum()), total + len(ids)
    tolerance = LLAMA_CPP_TOLERANCE.get(quant, 0.3)
    return {**check, "tokens_identical": same_tokens, "max_logit_diff_share": worst, "tolerance": tolerance,
            "argmax_agreement": agree / max(total, 1), "passed": same_tokens and worst <= tolerance}
