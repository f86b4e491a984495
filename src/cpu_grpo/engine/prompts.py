"""A prompt as the model reads it: its chat template applied (with the assistant header), then tokenized."""

from __future__ import annotations

from ..errors import UserError


def encode_prompts(tokenizer, prompts: list, instruction: str = "") -> list[list[int]]:
    """Chat-format each prompt (a question, `instruction` appended as its own line, or a list of chat messages:
    `Example.chat`) with the model's chat template and the assistant header, and tokenize it."""
    out = []
    for p in prompts:
        turns = p if isinstance(p, list) else [{"role": "user", "content": f"{p}\n{instruction}".strip()
                                                if instruction else p}]
        if getattr(tokenizer, "chat_template", None):
            text = _templated(tokenizer, turns)
        else:  # a base model: the earlier turns as plain lines, then the last one as a question
            text = "".join(f"{t['content']}\n" for t in turns[:-1]) + f"Question: {turns[-1]['content']}\nAnswer:"
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def _templated(tokenizer, turns: list[dict]) -> str:
    """The chat template applied to `turns`, or UserError in one sentence where the template refuses them (a role
    it does not take: jinja2's TemplateError, raised by the template's own `raise_exception`)."""
    try:
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception as e:
        if type(e).__name__ not in ("TemplateError", "TemplateSyntaxError", "UndefinedError"):
            raise
        roles = ", ".join(str(t.get("role")) for t in turns)
        raise UserError(f"the model's chat template refuses a prompt with the roles {roles} ({str(e)[:120]}): give "
                        "the prompts roles this model takes (system, user, assistant, in turn), or another model"
                        ) from None
