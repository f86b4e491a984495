"""Read what an export wrote back with another program, as a user would (llama.cpp for a GGUF where it is installed,
plain transformers and peft otherwise), and run verify's checks on it."""

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
    """The checks of this export. A GGUF where llama.cpp is installed is read by llama.cpp alone: its logits
    against the checkpoint's, and for a quantized file the paired held-out accuracy of its greedy answers.
    Otherwise the files are loaded back by transformers (and peft): greedy identity for exact formats, paired
    held-out accuracy for quantized GGUF. Every format: the exported chat template against the run's. An exact
    format's checks round `model`'s weights in place, as the file stores them. llama.cpp runs in a child process: if
    it crashes, the export is marked unchecked (`crashed`) and this returns."""
    from ..errors import NativeCrash
    from .gguf_arch import GGUFError, misread

    exact = req.format in ("hf", "peft") or req.quant in ("bf16", "f16")
    gguf_file = next(out.glob("*.gguf")) if req.format == "gguf" else None
    if gguf_file and has_llama_cpp():
        verify.round_to(model, *rounding(req))
        try:
            checks = by_llama_cpp(src, req, gguf_file, model, tok, template, exact, log)
        except NativeCrash as e:
            checks = {"llama.cpp": crashed(e, req.quant)}
    else:
        if gguf_file and (why := misread(model.config, out, gguf_file.name)):
            raise GGUFError(f"the GGUF was written but cannot be checked here ({why}), and llama.cpp is not "
                            "installed to read it (pip install llama-cpp-python): install it and export again, "
                            "or export again with --no-verify.")
        checks = by_transformers(src, req, out, model, tok, template, exact, log)
    _log(checks, log)
    return checks


def by_llama_cpp(src, req, gguf_file: Path, model, tok, template: str | None, exact: bool, log) -> dict:
    """llama.cpp's reading of the GGUF (engine.llamacpp, llama-cpp-python): no second copy of the weights in
    memory, and the reader the file is for."""
    import torch

    from ..engine.llamacpp import isolated
    from ..engine.sampler import stop_ids

    shape = (src.instruction, src.system)
    log(f"reading {gguf_file.name} with llama.cpp (transformers is not asked)")
    questions = [e.question for e in source.held_out(src, LLAMA_CPP_PROMPTS)]
    checks = {"llama.cpp": verify.llama_cpp_check(model, tok, gguf_file, questions, shape, req.quant)}
    written_template = gguf_template(gguf_file)
    checks["template"] = _template_check(written_template, template)
    if not exact and "error" not in checks["llama.cpp"]:
        examples, limit = source.held_out(src, req.verify_n), int(src.cfg.get("eval_max_new_tokens", 256))
        longest = max(map(len, verify.prompt_ids(tok, [e.question for e in examples], written_template, *shape)))
        stops = stop_ids(tok, model)
        with isolated(gguf_file, verify.ANSWER_BATCH, longest + limit + 1, torch.get_num_threads()) as llm:
            checks["accuracy"] = verify.accuracy_check(
                verify.greedy(model, tok, limit), tok, lambda ids: llm.generate(ids, 1, limit, 0.0, stops)[0], tok,
                written_template, examples, shape, limit, log, source.judge(src, limit), reader="llama.cpp")
    return checks


def crashed(e: Exception, quant: str) -> dict:
    """The llama.cpp check of a file whose reading crashed llama.cpp (in its child process): unchecked, not failed."""
    return {"kind": "llama.cpp", "quant": quant, "passed": False, "unchecked": True,
            "error": f"{e} while reading the file back, so the export is unchecked"}


def by_transformers(src, req, out: Path, model, tok, template: str | None, exact: bool, log) -> dict:
    """transformers' (and peft's) reading of the written files, beside the checkpoint."""
    from ..engine.sampler import stop_ids

    shape = (src.instruction, src.system)
    if exact:  # the checkpoint's unrounded logits, then its weights rounded as the file holds them, in place (no
        examples = source.held_out(src, GREEDY_PROMPTS)  # copy: an export's memory is the checkpoint's, once)
        first = verify.next_logits(model, tok, [e.question for e in examples], shape)
        verify.round_to(model, *rounding(req))
    written, written_tok, written_template = load_written(req, out, src)
    checks = {"template": _template_check(written_template, template)}
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
        checks["accuracy"] = verify.accuracy_check(verify.greedy(model, tok, limit), tok,
                                                   verify.greedy(written, written_tok, limit), written_tok,
                                                   written_template, examples, shape, limit, log,
                                                   source.judge(src, limit))
    return checks


def gguf_template(path: Path) -> str | None:
    """The chat template a GGUF carries (its metadata only; the tensors are not read)."""
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get("tokenizer.chat_template")
    return None if field is None else bytes(field.parts[field.data[0]]).decode()


def _template_check(written: str | None, template: str | None) -> dict:
    return {"kind": "template", "carries_instruction": bool(written and verify.prompt.MARK in written),
            "passed": template is None or written == template}


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
            log(f"accuracy on {c['n']} held-out problems: checkpoint {c['checkpoint']:.1%}, export {c['export']:.1%} "
                f"(read by {c['reader']}); "
                f"{c['sentence']}")
