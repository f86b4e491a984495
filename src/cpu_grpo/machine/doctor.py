"""`cpu-grpo doctor`: what this machine brings to a run, measured where it matters.

The CPU and the flags that decide bf16 and int8 speed (AVX-512 BF16, AMX, VNNI), physical cores, memory, torch and
its threads, bf16, fp32 and int8 matmul speed measured for a moment, the memory allocator training will use, the
model cache, and the optional extras installed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import time
from pathlib import Path

from .allocator import INSTALL, find_jemalloc

FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX-512 BF16", "amx_bf16": "AMX BF16",
         "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI", "amx_int8": "AMX INT8"}
INT8_FLAGS = ("AVX-512 VNNI", "AVX-VNNI", "AMX INT8")  # int8 dot products in hardware
EXTRAS = {"gradio": "app", "math_verify": "eval", "matplotlib": "eval", "tensorboard": "track", "trackio": "track",
          "wandb": "track"}  # optional module: the extra that installs it


def cpu() -> tuple[str, set[str]]:
    """The CPU's name and its flags (Linux: /proc/cpuinfo; elsewhere the platform's name and no flags)."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return platform.processor() or platform.machine(), set()
    name, flags = "", set()
    for line in info.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not name:
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name or platform.machine(), flags


def matmul_gflops(dtype, seconds: float, n: int = 1024) -> float:
    """GFLOP/s of n x n x n matmuls repeated for about `seconds` (best of the repetitions)."""
    import torch

    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def int8_gops(seconds: float, n: int = 1024) -> float:
    """GOP/s of n x n x n int8 matmuls with int32 sums (torch._int_mm, what int8 rollouts' kernels reach), or 0.0
    where this torch has no CPU kernel for them."""
    import torch

    a, b = torch.randint(-127, 127, (n, n), dtype=torch.int8), torch.randint(-127, 127, (n, n), dtype=torch.int8)
    try:
        torch._int_mm(a, b)
    except RuntimeError:
        return 0.0
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        torch._int_mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def bf16_wanted(setting: str) -> bool:
    """Whether rollouts and training run in bf16 for the config's `bf16` setting: never without oneDNN's bf16
    kernels; with `auto`, only where bf16 matmuls also beat fp32 ones. Some CPUs have the instructions and run them
    at half fp32's speed: a 2-core Intel Xeon VM (AVX-512 BF16, AMX hidden) read bf16 172 against fp32 333 GFLOP/s,
    and the default profile's update ran 1.4x faster in fp32, its rollout as fast (bench/README.md, issue 49)."""
    from ..engine.models import bf16_supported

    if setting == "false" or not bf16_supported():
        return False
    return setting == "true" or bf16_pays()


@functools.cache
def bf16_pays() -> bool:
    """Whether bf16 matmuls hold their own against fp32 ones here (a 0.2 s probe of each, once a process)."""
    import torch

    return not fp32_pays(matmul_gflops(torch.bfloat16, 0.2), matmul_gflops(torch.float32, 0.2))


def fp32_pays(bf16_gflops: float, fp32_gflops: float) -> bool:
    """`auto`'s rule: fp32 where its matmuls run FP32_MARGIN times bf16's speed. fp32 keeps twice the activations
    and weights, so it is chosen only where it clearly wins (also the planner's rule, planner.Machine.fp32)."""
    return fp32_gflops > FP32_MARGIN * bf16_gflops


FP32_MARGIN = 1.3


def facts(seconds: float = 2.0) -> dict:
    """Everything doctor reports, as a dict (`--json` prints it)."""
    import psutil
    import torch

    from ..engine.arch import ARCHS
    from ..engine.llamacpp import cpu_paths
    from ..engine.models import ALIASES, bf16_supported, cache_dir
    from ..engine.threads import set_threads

    name, flags = cpu()
    threads = set_threads()
    mem = psutil.virtual_memory()
    cached = {alias: str(p) for alias, a in ALIASES.items() if a.file and (p := cache_dir() / "gguf" / a.file).exists()}
    return {
        "cpu": name, "flags": {label: flag in flags for flag, label in FLAGS.items()},
        "physical_cores": psutil.cpu_count(logical=False), "logical_cpus": os.cpu_count(),
        "memory_gb": round(mem.total / 2**30, 1), "memory_available_gb": round(mem.available / 2**30, 1),
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads": threads,
        "bf16_kernels": bf16_supported(),
        "matmul_gflops": {"bf16": round(matmul_gflops(torch.bfloat16, seconds / 3)),
                          "fp32": round(matmul_gflops(torch.float32, seconds / 3)),
                          "int8": round(int8_gops(seconds / 3))},
        "jemalloc": find_jemalloc(), "model_cache": str(cache_dir()), "models_cached": cached,
        "extras": {module: _version(module) for module in EXTRAS}, "fast_path": list(ARCHS),
        "llama_cpp": llama_cpp_paths(cpu_paths()),
    }


def llama_cpp_paths(paths: list[str]) -> dict | None:
    """The CPU paths of the installed llama.cpp build (`paths`: engine.llamacpp.cpu_paths) and the one its matmuls
    take: AMX is left off where it is built in (engine.llamacpp: it crashed on the Intel build machine); None where
    llama-cpp-python is not installed.

    >>> llama_cpp_paths(["AVX2", "AVX512", "AMX_INT8", "REPACK"])
    {'paths': ['AVX2', 'AVX512', 'AMX_INT8', 'REPACK'], 'matmuls': 'AVX512', 'amx_off': True}
    >>> llama_cpp_paths(["AVX2", "AVX512", "REPACK"])["matmuls"], llama_cpp_paths([])
    ('AVX512', None)
    """
    from ..engine.llamacpp import extra_buffers_safe

    if not paths:
        return None
    used = next((p for p in ("AMX_INT8", "AVX512", "AVX2", "AVX") if p in paths and
                 (p != "AMX_INT8" or extra_buffers_safe(paths))), "scalar")
    return {"paths": paths, "matmuls": used, "amx_off": "AMX_INT8" in paths and not extra_buffers_safe(paths)}


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(module.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def advice(f: dict) -> list[str]:
    """What the facts mean for a run, one sentence each."""
    out = []
    ratio = f["matmul_gflops"]["bf16"] / max(1, f["matmul_gflops"]["fp32"])
    if not f["bf16_kernels"]:
        out.append("no bf16 kernels here (AVX-512 BF16 or AMX): runs compute in fp32, whatever --bf16 says.")
    elif ratio > 1.5:
        out.append(f"bf16 matmuls run {ratio:.1f}x faster than fp32 here: keep --bf16 true (the default).")
    else:
        out.append(f"bf16 matmuls are not faster than fp32 here ({ratio:.1f}x): --bf16 auto (or false) trains in "
                   "fp32, faster (the demo's steps 1.8x on such a CPU), but it learned less at the one seed "
                   "measured (results/demo-dtype).")
    out.append(int8_advice(f))
    if f["memory_available_gb"] < 8:
        out.append(f"{f['memory_available_gb']} GB of memory is free: on jemalloc the demo (SmolLM2-135M) peaks near "
                   "4.4 GiB and the 0.5B default profile near 3.6 GiB (on glibc 6.7 and 7.4-8.8 GiB).")
    if not f["jemalloc"]:
        out.append(f"no jemalloc here: training runs on glibc's malloc, whose memory grows step after step (the demo: "
                   f"6.2 GB after 12 steps against 3.8 GB with jemalloc): {INSTALL}.")
    if f["physical_cores"] and f["physical_cores"] < (f["logical_cpus"] or 0):
        out.append(f"{f['logical_cpus']} logical CPUs on {f['physical_cores']} cores: cpu-grpo uses one thread per "
                   "core (hyper-threads slow matmuls down).")
    if os.getloadavg()[0] > 0.5:
        out.append(f"the CPU is busy now (load {os.getloadavg()[0]:.1f}): measurements and runs will be slower.")
    missing = sorted({extra for module, extra in EXTRAS.items() if f["extras"][module] is None})
    if missing:
        out.append(f"optional parts not installed: pip install 'cpu-grpo[{','.join(missing)}]' (app: the web page; "
                   "eval: math-verify scoring and plots; track: report_to trackers).")
    return out


def int8_advice(f: dict) -> str:
    """What int8 rollouts would bring here: none without int8 dot products in hardware; with them, the measured
    end-to-end gain of the int8 sampler, too small to pay for its correction (issue 70)."""
    rate = f["matmul_gflops"].get("int8", 0) / max(1, f["matmul_gflops"]["bf16"])
    if not any(f["flags"].get(flag) for flag in INT8_FLAGS):
        return "no int8 dot products here (VNNI, AMX INT8): rollouts sample in bf16 (rollout_quantization none)."
    return (f"int8 matmuls run {rate:.1f}x bf16's rate here; int8 rollouts (rollout_quantization int8) sampled the "
            "default job 1.13x faster than bf16 on a 2-core AMD EPYC (docs/engine.md), short of what would pay for "
            "their correction: rollouts stay in bf16 unless you choose int8.")


def _llama_line(c: dict | None) -> str:
    if c is None:
        return "not installed (pip install llama-cpp-python: exports are then read back by llama.cpp itself)"
    off = " (its AMX path is built in but left off: it crashes on batches of more than one token, docs/export.md)"
    return f"built with {', '.join(c['paths'])}; matmuls on {c['matmuls']}{off if c['amx_off'] else ''}"


def render(f: dict) -> str:
    flags = ", ".join(f"{label} {'yes' if ok else 'no'}" for label, ok in f["flags"].items())
    models = ", ".join(f["models_cached"]) or "none yet (the first run fetches its model)"
    extras = ", ".join(f"{m} {v}" for m, v in f["extras"].items() if v) or "none"
    lines = [
        f"cpu         {f['cpu']}",
        f"flags       {flags}",
        f"cores       {f['physical_cores']} physical, {f['logical_cpus']} logical; torch uses {f['torch_threads']} "
        "threads",
        f"memory      {f['memory_gb']} GB, {f['memory_available_gb']} GB available",
        f"software    python {f['python']}, torch {f['torch']}, bf16 kernels {'yes' if f['bf16_kernels'] else 'no'}",
        f"matmul      bf16 {f['matmul_gflops']['bf16']} GFLOP/s, fp32 {f['matmul_gflops']['fp32']} GFLOP/s, int8 "
        f"{f['matmul_gflops']['int8']} GOP/s (1024^3, best over a third of --seconds each)",
        f"allocator   {'jemalloc (' + f['jemalloc'] + ')' if f['jemalloc'] else 'glibc (no jemalloc found)'} for "
        "cpu-grpo train",
        f"models      {f['model_cache']}: {models}",
        f"fast path   {', '.join(f['fast_path'])} (model_type; others run the generic transformers forward, slower)",
        f"extras      {extras}",
        f"llama.cpp   {_llama_line(f['llama_cpp'])}",
        "",
        *[f"- {line}" for line in advice(f)],
    ]
    return "\n".join(lines)
