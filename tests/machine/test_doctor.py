"""`cpu-grpo doctor`: the machine's facts, measured, and advice from them."""

from __future__ import annotations

import json

from cpu_grpo.cli import main
from cpu_grpo.machine import doctor


def test_doctor_reports_the_machine(capsys):
    assert main(["doctor", "--seconds", "0.2"]) == 0
    out = capsys.readouterr().out
    for word in ("cpu ", "AVX-512 BF16", "AVX-512 VNNI", "physical", "GB available", "torch", "GFLOP/s", "GOP/s",
                 "allocator", "models", "extras", "int8", "llama.cpp   "):
        assert word in out, word


def test_doctor_json_has_measured_numbers(capsys):
    assert main(["doctor", "--seconds", "0.2", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["physical_cores"] >= 1 and f["memory_gb"] > 0
    assert f["matmul_gflops"]["bf16"] > 0 and f["matmul_gflops"]["fp32"] > 0 and f["matmul_gflops"]["int8"] >= 0
    assert set(f["extras"]) == set(doctor.EXTRAS)


def test_advice_follows_the_facts():
    base = {"matmul_gflops": {"bf16": 800, "fp32": 200, "int8": 1600}, "bf16_kernels": True,
            "flags": {"AVX-512 VNNI": True}, "memory_available_gb": 20,
            "physical_cores": 2, "logical_cpus": 2, "extras": {m: "1.0" for m in doctor.EXTRAS},
            "jemalloc": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert "keep --bf16 true" in doctor.advice(base)[0]
    slow = {**base, "matmul_gflops": {"bf16": 100, "fp32": 200, "int8": 0}, "memory_available_gb": 4,
            "extras": {**base["extras"], "gradio": None}}
    said = " ".join(doctor.advice(slow))
    assert "--bf16 auto" in said and "4 GB" in said and "cpu-grpo[app]" in said
    assert "compute in fp32" in doctor.advice({**base, "bf16_kernels": False})[0]
    assert not any("jemalloc" in a for a in doctor.advice(base))
    assert any("apt-get install libjemalloc2" in a for a in doctor.advice({**base, "jemalloc": None}))


def test_int8_advice_follows_the_flags():
    f = {"matmul_gflops": {"bf16": 800, "fp32": 200, "int8": 1600}, "flags": {"AVX-512 VNNI": True}}
    assert doctor.int8_advice(f).startswith("int8 matmuls run 2.0x bf16's rate here")
    assert "sample in bf16" in doctor.int8_advice({**f, "flags": {"AVX-512 VNNI": False, "AMX INT8": False}})
