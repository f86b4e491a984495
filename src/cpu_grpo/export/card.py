"""export.md: what was exported from which checkpoint, how to ask it, the run's before/after table, the checks."""

from __future__ import annotations

import time
from pathlib import Path

from . import source


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def _usage(src: source.Source, req, out_name: str, files: dict, command: str) -> list[str]:
    """Copy-paste lines that load and ask the export, per format."""
    q = (src.example or "Tom has 3 apples and buys 5 more. How many apples does he have?").replace('"', "'")
    q = " ".join(q.split())[:300]
    turns = ([{"role": "system", "content": src.system}] if src.system else []) + [{"role": "user", "content": q}]
    if req.format == "hf":
        return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                f'tok = AutoTokenizer.from_pretrained("{out_name}")',
                f'model = AutoModelForCausalLM.from_pretrained("{out_name}")',
                f"ids = tok.apply_chat_template({turns!r}, add_generation_prompt=True, "
                'return_tensors="pt", return_dict=True)',
                "out = model.generate(**ids, max_new_tokens=256)",
                'print(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))', "```"]
    if req.format == "peft":
        return ["```python", "from peft import PeftModel",
                "from transformers import AutoModelForCausalLM, AutoTokenizer",
                f'base = AutoModelForCausalLM.from_pretrained("{source.base_name(src)}")  # or its local directory',
                f'model = PeftModel.from_pretrained(base, "{out_name}")',
                f'tok = AutoTokenizer.from_pretrained("{out_name}")', "```",
                f"The run's own copy of the base: `{src.adapter_base()}`."]
    gguf = next(n for n in files if n.endswith(".gguf"))
    lines = ["```bash", f'llama-cli -m {out_name}/{gguf} --jinja -p "{q}" -n 256 --temp 0',
             f"llama-server -m {out_name}/{gguf} --jinja", "```",
             "`--jinja` renders the chat template stored in the file, which appends the instruction; without it "
             "llama.cpp picks a built-in template by name and the instruction must be typed after the question."]
    if command:
        lines += ["", "Ollama (Modelfile beside the GGUF: TEMPLATE and SYSTEM as the run asked, its stop tokens, the "
                  "rollouts' temperature; the accuracy below is greedy: `/set parameter temperature 0`):", "",
                  "```bash", command, "```"]
    return lines


def _prompt_section(src: source.Source, example: str, template_carries: bool) -> list[str]:
    where = ("The exported chat template appends it to the user's message (unless the message already holds it), so "
             "ask the bare question." if template_carries else
             "The run appended no instruction: ask the question as the rows did." if not src.instruction else
             "The chat template was left as the checkpoint's (--keep-template, or a format without one): append it "
             "to every question yourself, after a newline.")
    system = [f"and with this system prompt first: `{src.system}`.", ""] if src.system else []
    return ["## The prompt the model learned", "",
            "The run asked every question as one user message: the question, a newline, then this instruction:", "",
            "```text", src.instruction or "(no instruction)", "```", "", *system, where, "",
            "A question as the model saw it in training (copy-paste this shape into any runner):", "",
            "```text", example, "```", ""]


def _checks(checks: dict) -> list[str]:
    if not checks:
        return ["Not verified (--no-verify)."]
    lines = []
    if c := checks.get("greedy"):
        lines += [f"- Greedy completions of {c['prompts']} held-out prompts (at most {c['max_new_tokens']} new "
                  "tokens), the export loaded back with transformers against the checkpoint: "
                  f"**{c['identical']} of {c['prompts']} identical**; prompt tokens "
                  f"{'identical' if c['prompt_tokens_identical'] else '**different**'}.",
                  f"- Largest logit difference: {c['max_logit_diff']:.2e} against the checkpoint's weights rounded to "
                  f"{c['rounded_to']} (what the file stores), {c['max_logit_diff_unrounded']:.2e} at the next token "
                  "against the unrounded fp32 checkpoint."]
    if c := checks.get("accuracy"):
        cmp = c["comparison"]
        lines += [f"- Greedy held-out accuracy on {c['n']} of the run's held-out problems (test split, seed + 1; "
                  f"completions up to {c['max_new_tokens']} tokens): checkpoint **{c['checkpoint']:.1%}**, export "
                  f"(read by {c['reader']}) "
                  f"**{c['export']:.1%}**; {c['sentence']} Right only in the checkpoint: {cmp['b']}, only in the "
                  f"export: {cmp['c']}; identical completions: {c['same_answer']} of {c['n']}."]
    if c := checks.get("llama.cpp"):
        lines.append(f"- Read by llama.cpp itself: {c['error']}." if "error" in c else
                     f"- Read by llama.cpp itself (llama-cpp-python), {c['prompts']} held-out prompts: tokens "
                     f"{'identical' if c['tokens_identical'] else '**different**'}; largest logit difference "
                     f"{c['max_logit_diff_share']:.1%} of the checkpoint's largest logit (at most "
                     f"{c['tolerance']:.0%} for {c['quant']}); argmax agreement {c['argmax_agreement']:.0%}.")
    if c := checks.get("template"):
        lines.append(f"- Chat template as written: {'carries' if c['carries_instruction'] else 'does not carry'} the "
                     f"instruction; read back {'unchanged' if c['passed'] else '**changed**'}.")
    verdict = "passed" if all(x.get("passed", True) for x in checks.values()) else \
        "**not done: the export is UNCHECKED**" if any(x.get("unchecked") for x in checks.values()) else "**FAILED**"
    return [*lines, "", f"Verification {verdict}."]


def write(out: Path, src: source.Source, req, result) -> None:
    """out/export.md for this export."""
    from ..rundir import code_version

    quant = f" ({req.quant})" if req.quant else ""
    files = "\n".join(f"- `{n}`: {_size(b)}" for n, b in result.files.items())
    kind = "LoRA adapter merged into its base" if src.lora and req.format != "peft" else \
        "LoRA adapter" if src.lora else "full fine-tune"
    carries = bool(result.checks.get("template", {}).get("carries_instruction")) if result.checks else \
        not req.keep_template and bool(src.instruction)
    lines = [f"# Export: {req.format}{quant}", "",
             f"From checkpoint `{src.checkpoint}` (step {src.step}, model `{src.cfg.get('model')}`, {kind}), written "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by cpu-grpo {code_version()} in "
             f"{result.seconds:.1f} s.", "", files, "",
             *_prompt_section(src, result.example, carries), "## How to run it", "",
             *_usage(src, req, str(result.out), result.files, result.command), "",
             "## The run's held-out accuracy, before and after training", "", source.before_after(src), "",
             "## Verification", "", *_checks(result.checks), ""]
    (out / "export.md").write_text("\n".join(lines))
