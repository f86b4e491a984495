"""The prompt travels with the model: the run's instruction inside the exported chat template.

A run asks every question as one user message, `question + "\\n" + instruction` (prompts.encode_prompts). The
exported chat template appends the instruction to the last user message itself (unless the message already
contains it), so that `apply_chat_template([{"role": "user", "content": question}])`, llama.cpp's `--jinja` and
anything else that renders the template ask the model the way it learned.
"""

from __future__ import annotations

MARK = "{#- cpu-grpo: the instruction the run trained with -#}"


def _literal(text: str) -> str:
    """A Jinja string literal holding `text`."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


def with_instruction(template: str | None, instruction: str, system: str = "") -> str | None:
    """`template` with the instruction appended to the last user message and, when the run had one, its system
    prompt put first where the messages have none; unchanged when there is neither."""
    if not template or not (instruction or system) or MARK in template:
        return template
    head = MARK
    if instruction:
        lit = _literal(instruction)
        head += (f"{{%- if messages and messages[-1]['role'] == 'user' and messages[-1]['content'] is string "
                 f"and {lit} not in messages[-1]['content'] -%}}"
                 f"{{%- set messages = messages[:-1] + [{{'role': 'user', 'content': (messages[-1]['content'] ~ "
                 f"'\\n' ~ {lit}) | trim}}] -%}}{{%- endif -%}}")
    if system:
        head += (f"{{%- if not messages or messages[0]['role'] != 'system' -%}}{{%- set messages = [{{'role': "
                 f"'system', 'content': {_literal(system)}}}] + messages -%}}{{%- endif -%}}")
    return head + template


def messages(question: str, instruction: str, system: str) -> list[dict]:
    """The run's prompt for a question, as Example.chat makes it for a math problem."""
    content = f"{question}\n{instruction}".strip() if instruction else question
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]


def chat_prompt(tok, question: str, template: str | None, instruction: str, system: str = "") -> str:
    """The text a model is given for `question`: through `template` when the prompt shape is in it (the bare
    question), else with the instruction and system prompt added by hand (the run's shape)."""
    turns = [{"role": "user", "content": question}] if template and MARK in template else \
        messages(question, instruction, system)
    if template:
        return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, chat_template=template)
    return "".join(f"{t['content']}\n" for t in turns[:-1]) + f"Question: {turns[-1]['content']}\nAnswer:"


def single_turn(tok, template: str | None, instruction: str, system: str = "") -> tuple[str, str | None]:
    """(TEMPLATE, SYSTEM) for an Ollama Modelfile: the run's one-turn prompt with `{{ .Prompt }}` for the question and
    `{{ .System }}` where the template puts a system message, SYSTEM being the one it adds by default (or None)."""
    q, s = "\x00QUESTION\x00", "\x00SYSTEM\x00"
    content = f"{q}\n{instruction}".strip() if instruction else q
    if not template:
        return chat_prompt(tok, q, None, instruction, system).replace(q, "{{ .Prompt }}"), None

    def render(turns):
        return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, chat_template=template)

    plain = render([{"role": "user", "content": content}])
    with_system = render([{"role": "system", "content": s}, {"role": "user", "content": content}])
    if s not in with_system:
        return render(messages(q, instruction, system)).replace(q, "{{ .Prompt }}"), None
    before, after = with_system.split(s, 1)
    if plain.startswith(before) and plain.endswith(after) and len(plain) >= len(before) + len(after):
        default = plain[len(before):len(plain) - len(after)]  # what the template writes when no system is given
        go = with_system.replace(q, "{{ .Prompt }}").replace(s, "{{ .System }}")
        return go, system or default or None
    return render(messages(q, instruction, system)).replace(q, "{{ .Prompt }}"), None
