"""Many rows decoded as one llama.cpp batch (llama-cpp-python's C API), a KV stream a row: an exported GGUF read by
llama.cpp itself (export's checks) and a sampler measured against ours (bench/llamacpp_rollout.py). Callers run it
in a child process of its own (`isolated`): a crash in llama.cpp ends the child, not the command.

llama.cpp's AMX path (weights repacked into an AMX buffer, compiled in where the build machine has AMX) dies by
SIGSEGV in ggml_backend_amx_mul_mat on any batch of more than one token, at every quantized type tried (q8_0, q4_0,
q4_k_m; llama-cpp-python 0.3.36 on the Intel Xeon build machine, 2026-12-07; ggml-org/llama.cpp#20824): where the
build has AMX, weights are loaded without extra buffer types (`llama-cli --no-repack`), elsewhere as llama.cpp
chooses (its CPU repacking kept on AVX-512 machines).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

_QUIET = []  # the log callback given to llama.cpp, kept alive for as long as the process: llama.cpp calls it
_ERRORS: list[str] = []  # llama.cpp's error lines, the last few: a load's reason
GGML_LOG_LEVEL_ERROR = 4


def _quiet(L) -> None:
    """llama.cpp's log silenced but for its errors, kept for the reason of a failed load; once."""
    def keep(level, text, data):
        if level == GGML_LOG_LEVEL_ERROR:
            _ERRORS[:] = [*_ERRORS[-4:], text.decode(errors="replace").strip()]

    if not _QUIET:
        _QUIET.append(L.llama_log_callback(keep))
    L.llama_log_set(_QUIET[0], ctypes.c_void_p(0))


def cpu_paths() -> list[str]:
    """The CPU features this llama.cpp build uses (llama_print_system_info's flags set to 1: AMX_INT8, AVX512, ...);
    [] where llama-cpp-python is not installed."""
    try:
        import llama_cpp as L
    except ImportError:
        return []
    info = L.llama_print_system_info().decode()
    return [flag.split("=")[0].strip() for flag in info.replace("CPU :", "").split("|") if flag.strip().endswith("= 1")]


def extra_buffers_safe(paths: list[str]) -> bool:
    """Whether llama.cpp's extra buffer types (AMX, CPU repacking) may be used: not where the build has AMX (see the
    module)."""
    return "AMX_INT8" not in paths


def _model_params(default):
    """llama.cpp's model parameters from `default` (llama_model_default_params), extra buffer types off where the
    build has AMX (see the module)."""
    p = default()
    p.use_extra_bufts = extra_buffers_safe(cpu_paths())
    return p


class LlamaCpp:
    """A GGUF model and a context of `rows` KV streams of `ctx_per_row` tokens each, decoding at most `batch` tokens
    at a time (llama.cpp keeps a batch's logits: `batch` x vocabulary floats); a context manager that frees them."""

    def __init__(self, path: Path, rows: int, ctx_per_row: int, threads: int, batch: int = 512):
        import llama_cpp as L

        self.L = L
        _quiet(L)
        L.llama_backend_init()
        _ERRORS.clear()
        self.model = L.llama_model_load_from_file(str(path).encode(), _model_params(L.llama_model_default_params))
        if not self.model:
            raise ValueError(_ERRORS[-1] if _ERRORS else f"llama.cpp cannot load {path}")
        p = L.llama_context_default_params()
        p.n_ctx, p.n_seq_max, p.kv_unified = rows * ctx_per_row, rows, False
        p.n_batch = p.n_ubatch = self.size = max(batch, rows)
        p.n_threads = p.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, p)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(self.size, 0, 1)
        self.adapter = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free llama.cpp's model, context and adapter."""
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        if self.adapter is not None:
            L.llama_adapter_lora_free(self.adapter)
        L.llama_model_free(self.model)

    def set_adapter(self, path: Path) -> None:
        """Load the GGUF LoRA adapter at `path` in place of the last one."""
        L = self.L
        new = L.llama_adapter_lora_init(self.model, str(path).encode())
        L.llama_set_adapters_lora(self.ctx, (L.llama_adapter_lora_p_ctypes * 1)(new), 1, (ctypes.c_float * 1)(1.0))
        if self.adapter is not None:
            L.llama_adapter_lora_free(self.adapter)
        self.adapter = new

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokens of `text`, special tokens parsed, no BOS added."""
        L, raw = self.L, text.encode()
        vocab = L.llama_model_get_vocab(self.model)
        n = -L.llama_tokenize(vocab, raw, len(raw), None, 0, False, True)  # how many it needs
        ids = (L.llama_token * n)()
        L.llama_tokenize(vocab, raw, len(raw), ids, n, False, True)
        return list(ids)

    def logits(self, ids: list[int]) -> np.ndarray:
        """The logits at every position of `ids` (T, V), read as one sequence from an empty cache, in pieces that fit
        a batch."""
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
        return np.concatenate([self._decode([(t, j, 0, True) for j, t in enumerate(ids[k:k + self.size], k)])
                               for k in range(0, len(ids), self.size)])

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Decode (token, position, row, wants logits) entries; the logits of those that want them, in order."""
        b = self.batch
        for i, (token, pos, row, out) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, out
            b.seq_id[i][0] = row
        b.n_tokens = len(entries)
        if rc := self.L.llama_decode(self.ctx, b):
            raise RuntimeError(f"llama_decode returned {rc}")
        n = sum(e[3] for e in entries)
        return np.ctypeslib.as_array(self.L.llama_get_logits(self.ctx), shape=(n, self.vocab)).copy()

    def generate(self, prompts: list[list[int]], g: int, new: int, temperature: float, stops: tuple[int, ...],
                 gen: torch.Generator | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """G completions of each prompt (group-major), each cut after its first stop token, and the log-probs
        llama.cpp gave their tokens; temperature 0 is greedy. A group's prompt is prefilled once and copied."""
        L = self.L
        mem = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(mem, True)
        last = []
        for i, p in enumerate(prompts):  # into the group's first row, in pieces that fit a batch
            for k in range(0, len(p), self.size):
                out = self._decode([(t, j, i * g, j == len(p) - 1) for j, t in enumerate(p[k:k + self.size], k)])
            last.append(out[0])
            for j in range(1, g):
                L.llama_memory_seq_cp(mem, i * g, i * g + j, -1, -1)
        logits = np.repeat(np.stack(last), g, axis=0)
        done, logps = [[] for _ in range(len(prompts) * g)], [[] for _ in range(len(prompts) * g)]
        live = list(range(len(done)))
        for _ in range(new):
            lp = torch.log_softmax(torch.from_numpy(logits) / max(temperature, 1e-6), dim=-1)
            picked = (torch.multinomial(lp.exp(), 1, generator=gen).squeeze(1) if temperature > 0
                      else lp.argmax(-1))
            still = []
            for k, row in enumerate(live):
                token = int(picked[k])
                done[row].append(token)
                logps[row].append(float(lp[k, token]))
                if token not in stops:
                    still.append(row)
            live = still
            if not live:
                break
            plen = {row: len(prompts[row // g]) for row in live}
            logits = self._decode([(done[r][-1], plen[r] + len(done[r]) - 1, r, True) for r in live])
        return done, logps


def high_level(path: Path, **kw):
    """llama-cpp-python's own `Llama` (chat templates, create_chat_completion), its weights loaded as LlamaCpp loads
    them: without extra buffer types where the build has AMX (its constructor has no switch for it, so the default
    parameters it starts from are changed while it loads)."""
    import llama_cpp
    import llama_cpp.llama_cpp as C

    default = C.llama_model_default_params
    C.llama_model_default_params = lambda: _model_params(default)
    try:
        return llama_cpp.Llama(model_path=str(path), **kw)
    finally:
        C.llama_model_default_params = default


def isolated(path: Path, rows: int, ctx_per_row: int, threads: int, batch: int = 512):
    """A LlamaCpp in a child process of its own (engine.isolated): the same calls, and a crash in llama.cpp raises
    NativeCrash here instead of ending this process."""
    from .isolated import Isolated

    return Isolated("llama.cpp", LlamaCpp, Path(path), rows, ctx_per_row, threads, batch)
