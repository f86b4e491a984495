"""An Ollama Modelfile beside a GGUF: FROM the file, the run's prompt as TEMPLATE and SYSTEM, its stop tokens and
its sampling settings, and the `ollama create` line that builds it."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError
from . import prompt

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*(:[a-z0-9._-]+)?$")


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise UserError(f"--ollama {name!r} is not a model name Ollama accepts: use lower-case letters, digits, '.', "
                        "'-' and '_', optionally ':tag' (my-model:q8_0).")


def _quoted(text: str) -> str:
    if '"""' in text:
        raise UserError('the chat template contains """, which a Modelfile cannot quote: write the Modelfile by hand.')
    return f'"""{text}"""'


def modelfile(gguf_file: str, tok, template: str | None, shape: tuple[str, str], stops: list[str], sampling: dict,
              num_predict: int) -> str:
    """The Modelfile's text: FROM ./<file>, TEMPLATE and SYSTEM as the run asked (`shape`: its instruction and
    system prompt), stops, sampling."""
    go_template, system = prompt.single_turn(tok, template, *shape)
    lines = [f"# made by cpu-grpo export: the run's prompt shape (instruction: {shape[0]!r})",
             f"FROM ./{gguf_file}", f"TEMPLATE {_quoted(go_template)}"]
    if system:
        lines.append(f"SYSTEM {_quoted(system)}")
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines.append(f"PARAMETER temperature {sampling.get('temp', 0.0):g}")
    if sampling.get("top_k"):
        lines.append(f"PARAMETER top_k {sampling['top_k']}")
    if sampling.get("top_p", 1.0) < 1.0:
        lines.append(f"PARAMETER top_p {sampling['top_p']:g}")
    lines.append(f"PARAMETER num_predict {num_predict}")
    return "\n".join(lines) + "\n"


def write(out: Path, name: str, gguf_file: str, tok, template: str | None, shape: tuple[str, str],
          stops: list[str], sampling: dict, num_predict: int) -> str:
    """Write out/Modelfile; return the command that makes the Ollama model."""
    check_name(name)
    (out / "Modelfile").write_text(modelfile(gguf_file, tok, template, shape, stops, sampling, num_predict))
    return f"cd {out} && ollama create {name} -f Modelfile && ollama run {name}"
