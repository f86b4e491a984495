"""`cpu-grpo export`: one checkpoint written as hf, peft or gguf (+ an Ollama Modelfile), checked, with export.md.

Everything is written into a hidden directory beside the output and renamed when complete: a failed or
interrupted export (a full disk) leaves no partial files, and the checkpoint is only ever read.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from . import card, source

FORMATS = ("hf", "peft", "gguf")
EXAMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"
DEFAULT_QUANT = {"hf": "f32", "peft": "", "gguf": "bf16"}


@dataclass
class Request:
    spec: str  # a run directory or a checkpoint
    format: str = "gguf"
    quant: str = ""  # "" means DEFAULT_QUANT[format]
    out: str = ""  # "" means <run>/exports/<format>[-<quant>]
    ollama: str = ""  # a model name: write a Modelfile (gguf only)
    verify: bool = True
    overwrite: bool = False
    keep_template: bool = False  # leave the chat template as the checkpoint's (no instruction in it)
    verify_n: int = 200  # held-out problems for a quantized export's accuracy check
    greedy_tokens: int = 64  # new tokens of each greedy comparison


@dataclass
class Result:
    out: Path
    files: dict[str, int]  # name -> bytes
    seconds: float  # writing only
    checks: dict = field(default_factory=dict)
    command: str = ""  # the ollama create line
    example: str = ""  # the run's prompt for EXAMPLE, as the model sees it

    @property
    def passed(self) -> bool:
        return all(c.get("passed", True) for c in self.checks.values())

    def verdict(self) -> tuple[int, str]:
        """`cpu-grpo export`'s exit code and, unless it passed, its last sentence: 3 when the export could not be
        checked (llama.cpp crashed reading it back), 1 when it does not match its checkpoint."""
        if why := next((c["error"] for c in self.checks.values() if c.get("unchecked")), ""):
            return 3, (f"{why}: the file is kept at {self.out}, marked unchecked in export.md; read it with llama.cpp "
                       "before you use it (llama-cli -m FILE), and report the crash with `cpu-grpo doctor`'s output "
                       "(docs/export.md).")
        if not self.passed:
            return 1, ("the export does not match its checkpoint (see the verification in export.md): do not use "
                       "it; report this with export.md attached.")
        return 0, ""


def check(req: Request) -> Request:
    """The request with its defaults filled in, or a UserError naming what is wrong (before anything is loaded)."""
    from . import gguf, hf, ollama

    if req.format not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, not {req.format}.")
    quant = (req.quant or DEFAULT_QUANT[req.format]).lower()
    if req.format == "gguf" and quant not in gguf.QUANTS:
        gguf.check_request("llama", quant)
    if req.format == "hf":
        hf.torch_dtype(quant)
    if req.format == "peft" and quant:
        raise UserError("--format peft copies the adapter as trained: leave out --quant.")
    if req.ollama:
        if req.format != "gguf":
            raise UserError("--ollama needs --format gguf: Ollama runs GGUF files.")
        ollama.check_name(req.ollama)
    return Request(**{**req.__dict__, "quant": quant})


def default_out(src: source.Source, req: Request) -> Path:
    where = src.run_dir or src.checkpoint.parent
    return where / "exports" / f"{req.format}{'-' + req.quant if req.quant else ''}-step{src.step:06d}"


def export(req: Request, log=print) -> Result:
    """Write, check and describe one export (see the module); returns where it went and what the checks found."""
    req = check(req)
    src = source.find(req.spec, log)
    if req.format == "peft" and not src.lora:
        raise UserError(f"{src.checkpoint} is a full fine-tune, not LoRA: it has no adapter to export; use "
                        "--format hf (the whole model) or gguf.")
    out = Path(req.out).expanduser() if req.out else default_out(src, req)
    if out.exists() and not req.overwrite:
        raise UserError(f"{out} exists: choose another --out, or add --overwrite to replace it.")
    if why := unsafe_out(out, src):
        raise UserError(f"--out {req.out or out} {why}: an export never replaces it; choose another --out (by "
                        f"default {default_out(src, req)}).")
    try:  # before the model loads: a folder that cannot be written is found now
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    except OSError as e:
        raise UserError(f"cannot write into {out.parent} ({e.strerror}): choose another --out.") from None
    try:
        result = _write_and_check(src, req, tmp, log)
        result.out, result.command = out, result.command.replace(str(tmp), str(out))
        card.write(tmp, src, req, result)
        result.files["export.md"] = (tmp / "export.md").stat().st_size
        _replace(tmp, out, log)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # safetensors says a full disk in its own error type, not an OSError
        full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(e)
        if full:
            raise UserError(f"the disk filled while writing the export to {out.parent}: removed the partial files "
                            f"(the checkpoint {src.checkpoint} is untouched); free some space or choose another "
                            "--out, then export again.") from None
        raise
    return result


RUN_MARKERS = ("metrics.jsonl", "train_config.yaml", "run.lock", "status.json", "checkpoints")


def unsafe_out(out: Path, src: source.Source) -> str | None:
    """Why `out` may not be replaced by an export (it holds the checkpoint being exported, the folder you are in,
    or a run), else None."""
    where = out.resolve()
    if where == src.checkpoint.resolve() or where in src.checkpoint.resolve().parents:
        return f"holds the checkpoint being exported ({src.checkpoint})"
    if where == Path.cwd().resolve() or where in Path.cwd().resolve().parents:
        return "is the folder you are in, or holds it"
    if where.is_dir():
        runs = [m for m in RUN_MARKERS if (where / m).exists()] or \
            [f"{d.name}/{m}" for d in where.iterdir() if d.is_dir() for m in RUN_MARKERS if (d / m).exists()][:1]
        if runs:
            return f"holds a training run ({runs[0]})"
    return None


def _replace(tmp: Path, out: Path, log=print) -> None:
    """Put the finished export `tmp` at `out`. An earlier export there (its export.md) is removed; anything else of
    yours is moved aside, visibly, and the line says where."""
    old = None
    if out.exists():
        earlier = out.is_dir() and ((out / "export.md").exists() or not any(out.iterdir()))
        old = out.with_name(f".{out.name}.old-{time.time_ns()}" if earlier else
                            f"{out.name}.before-export-{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(old)
        log(f"replaced the earlier export at {out}" if earlier else f"moved what was at {out} to {old} (--overwrite)")
        if not earlier:
            old = None
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_and_check(src: source.Source, req: Request, tmp: Path, log) -> Result:
    from . import prompt

    log(f"loading {src.checkpoint}")
    model, tok = source.load(src, log)
    template = tok.chat_template if req.keep_template else \
        prompt.with_instruction(tok.chat_template, src.instruction, src.system)
    t0 = time.time()
    command = _write(src, req, tmp, model, tok, template, log)
    seconds = time.time() - t0
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    log(f"wrote {', '.join(files)} in {seconds:.1f} s")
    result = Result(tmp, files, seconds, command=command,
                    example=prompt.chat_prompt(tok, src.example or EXAMPLE, tok.chat_template, src.instruction,
                                               src.system))
    if req.verify:
        from . import readback

        result.checks = readback.run(src, req, tmp, model, tok, template, log)
    return result


def _write(src: source.Source, req: Request, tmp: Path, model, tok, template: str | None, log) -> str:
    from ..engine.sampler import stop_ids
    from . import gguf, hf, ollama

    stops = stop_ids(tok, model)
    if req.format == "hf":
        hf.write_full(model, tok, tmp, req.quant, template, stops)
        return ""
    if req.format == "peft":
        hf.write_adapter(src.checkpoint, tok, tmp, source.base_name(src), template)
        return ""
    name = gguf_file(src, req)
    counts = gguf.write(model, tok, src.checkpoint, tmp / name, req.quant, _model_name(src), template, log)
    log("tensors: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    if not req.ollama:
        return ""
    cfg = src.cfg
    sampling = {"temp": cfg.get("temperature", 0.7), "top_k": cfg.get("top_k", 0), "top_p": cfg.get("top_p", 1.0)}
    words = [tok.convert_ids_to_tokens(i) for i in stops]
    return ollama.write(tmp, req.ollama, name, tok, tok.chat_template, (src.instruction, src.system), words,
                        sampling, int(cfg.get("eval_max_new_tokens", 256)))


def gguf_file(src: source.Source, req: Request) -> str:
    return f"{_model_name(src)}-{req.quant}.gguf"


def _model_name(src: source.Source) -> str:
    run = src.run_dir.name if src.run_dir else src.checkpoint.parent.name
    return f"{run}-step{src.step}".replace(" ", "-")
