"""Load what an export wrote with plain transformers (and peft), as a user would, and run verify's checks on it."""

from __future__ import annotations

from pathlib import Path

from . import source, verify

GREEDY_PROMPTS = 20  # held-out prompts whose greedy completions must be identical


def load_written(req, out: Path, src: source.Source):
    """(model, tokenizer, chat template) of the export in `out`, loaded without cpu-grpo's loader."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if req.format == "hf":
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(out)
    elif req.format == "peft":
        from peft import PeftModel

        from ..engine.models import resolve_model

        base = AutoModelForCausalLM.from_pretrained(resolve_model(src.adapter_base()), dtype=torch.float32)
        model = PeftModel.from_pretrained(base, out)
        tok = AutoTokenizer.from_pretrained(out)
    else:
        name = next(out.glob("*.gguf")).name
        model = AutoModelForCausalLM.from_pretrained(out, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(out, gguf_file=name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.eval(), tok, tok.chat_template


def rounding(req):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16}.get(req.quant), req.format == "gguf"


def run(src: source.Source, req, out: Path, model, tok, template: str | None, log=print) -> dict:
    """The checks of this export: greedy identity for exact formats, paired held-out accuracy for quantized GGUF,
    and the exported chat template's prompt against the run's (its tokens, for every format). An exact format's
    checks round `model`'s weights in place, as the file stores them."""
    from ..engine.sampler import stop_ids
    from .gguf_arch import GGUFError, misread

    shape, checks = (src.instruction, src.system), {}
    exact = req.format in ("hf", "peft") or req.quant in ("bf16", "f16")
    if exact:  # the checkpoint's unrounded logits, then its weights rounded as the file holds them, in place (no
        examples = source.held_out(src, GREEDY_PROMPTS)  # copy: an export's memory is the checkpoint's, once)
        first = verify.next_logits(model, tok, [e.question for e in examples], shape)
        verify.round_to(model, *rounding(req))
    if req.format == "gguf":
        gguf_file = next(out.glob("*.gguf"))
        if has_llama_cpp():  # llama.cpp itself, where `make test` (or the [llamacpp] extra) built it
            log(f"reading {gguf_file.name} with llama.cpp")
            checks["llama.cpp"] = verify.llama_cpp_check(model, tok, gguf_file, [e.question for e in
                                                         source.held_out(src, LLAMA_CPP_PROMPTS)], shape, req.quant)
        if why := misread(model.config, out, gguf_file.name):
            if not checks:
                raise GGUFError(f"the GGUF was written but cannot be checked here ({why}), and llama.cpp is not "
                                "installed to read it (pip install llama-cpp-python): install it and export again, "
                                "or export again with --no-verify.")
            log(f"transformers cannot read this GGUF back ({why}): llama.cpp's reading is the check")
            _log(checks, log)
            return checks
    written, written_tok, written_template = load_written(req, out, src)
    checks["template"] = {"kind": "template", "carries_instruction": bool(written_template and
                                                                          verify.prompt.MARK in written_template),
                          "passed": template is None or written_template == template}
    if exact:
        log(f"checking greedy completions of {len(examples)} held-out prompts against the checkpoint")
        dtype = rounding(req)[0]
        rounded_to = str(dtype).replace("torch.", "") if dtype else "none"
        checks["greedy"] = verify.greedy_check(model, tok, written, written_tok, [e.question for e in examples],
                                               shape, written_template, stop_ids(tok, model), req.greedy_tokens,
                                               first, rounded_to)
    else:
        examples = source.held_out(src, req.verify_n)
        limit = int(src.cfg.get("eval_max_new_tokens", 256))
        checks["accuracy"] = verify.accuracy_check(model, tok, written, written_tok, written_template, examples,
                                                   shape, limit, log, source.judge(src, limit))
    _log(checks, log)
    return checks


LLAMA_CPP_PROMPTS = 8  # held-out prompts llama.cpp reads, every position's logits compared


def has_llama_cpp() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def _log(checks: dict, log) -> None:
    for name, c in checks.items():
        if name == "greedy":
            log(f"greedy: {c['identical']}/{c['prompts']} completions identical, prompt tokens "
                f"{'identical' if c['prompt_tokens_identical'] else 'DIFFERENT'}, largest logit difference "
                f"{c['max_logit_diff']:.2e} (weights rounded to {c['rounded_to']}), "
                f"{c['max_logit_diff_unrounded']:.2e} against the unrounded checkpoint")
        elif name == "llama.cpp":
            log(f"llama.cpp: {c['error']}" if "error" in c else
                f"llama.cpp: {c['prompts']} prompts, tokens {'identical' if c['tokens_identical'] else 'DIFFERENT'}, "
                f"largest logit difference {c['max_logit_diff_share']:.1%} of the largest logit (at most "
                f"{c['tolerance']:.0%} for {c['quant']}), argmax agreement {c['argmax_agreement']:.0%}")
        elif name == "accuracy":
            log(f"accuracy on {c['n']} held-out problems: checkpoint {c['checkpoint']:.1%}, export {c['export']:.1%}; "
                f"{c['sentence']}")
