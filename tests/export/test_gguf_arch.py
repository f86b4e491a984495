"""The GGUF writer's architectures past llama and qwen2 (src/cpu_grpo/export/gguf_arch.py): qwen3, gemma3_text and
phi3 read back by transformers' GGUF loader with the same logits; smollm3 and rope scaling, which that loader does not
read, checked against what llama.cpp's convert_hf_to_gguf.py writes (names, shapes, keys, values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cpu_grpo.export import gguf as gguf_mod
from cpu_grpo.export import gguf_arch

COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=1024, initializer_range=0.2)


def _model(kind: str, tok, seed: int = 0, **fields):
    """A tiny random model of `kind` with the fixture's tokenizer; norms moved off 1 (and 0) so that they count."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        SmolLM3Config,
        SmolLM3ForCausalLM,
    )

    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM),
               "phi3": (Phi3Config, Phi3ForCausalLM), "smollm3": (SmolLM3Config, SmolLM3ForCausalLM),
               "llama": (LlamaConfig, LlamaForCausalLM)}
    # Gemma 3 as llama.cpp assumes it: query scale head_dim^-0.5 (transformers' GGUF loader reads neither field, so
    # head_dim and the scalar stay at its defaults, 256); a window shorter than the test's sequence
    shape = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                 sliding_window=8) if kind == "gemma3_text" else {}
    config_cls, model_cls = classes[kind]
    config = config_cls(**{**COMMON, **shape, **fields}, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _write(model, tok, tok_dir, where: Path, quant: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"m-{quant}.gguf"
    gguf_mod.write(model, tok, Path(tok_dir), path, quant, "tiny", tok.chat_template)
    return path


def _fields(path: Path) -> dict:
    from gguf import GGUFReader

    return {k: f.contents() for k, f in GGUFReader(path).fields.items() if not k.startswith("tokenizer.ggml.t")}


def _tensors(path: Path) -> dict:
    """name -> (its values as float32 in GGUF's order of dimensions reversed, i.e. PyTorch's; its GGML type)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    return {t.name: (dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)]),
                     t.tensor_type.name) for t in GGUFReader(path).tensors}


def _as_stored(model, quant: str):
    """A copy of `model` with its matrices as the file stores them (vectors stay F32 in a GGUF)."""
    import copy

    import torch
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            if p.ndim < 2:
                continue
            if quant == "q8_0":
                p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), T.Q8_0), T.Q8_0)))
            else:
                p.copy_(p.to({"bf16": torch.bfloat16, "f16": torch.float16}[quant]).float())
    return ref


# ---------------------------------------------------------------------------- read back by transformers
@pytest.mark.parametrize("kind", ["qwen3", "gemma3_text", "phi3"])
@pytest.mark.parametrize("quant", ["bf16", "f16", "q8_0"])
def test_transformers_reads_back_the_same_model(tmp_path, tok, tiny_model, kind, quant):
    """Logits of the file loaded by transformers against the original with its matrices rounded (or Q8_0-blocked)
    as the file stores them: any difference is the writer's (measured 0.0 for all nine)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = _model(kind, tok)
    path = _write(model, tok, tiny_model, tmp_path, quant)
    assert gguf_arch.misread(model.config, tmp_path, path.name) is None
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(0, len(tok), (1, 40), generator=torch.Generator().manual_seed(1))  # 40 > the window of 8
    with torch.no_grad():
        theirs, mine = back(ids).logits, _as_stored(model, quant)(ids).logits
    assert float((theirs - mine).abs().max()) < 1e-4
    with torch.no_grad():
        assert float((theirs - model(ids).logits).abs().max()) > 0  # the rounding is real: the check sees weights


def test_each_architecture_has_llama_cpps_tensors_and_keys(tmp_path, tok, tiny_model):
    """The tensor names of gguf's own table for the architecture, the converter's keys and changes per model."""
    import gguf

    for kind, arch in (("qwen3", "qwen3"), ("gemma3_text", "gemma3"), ("phi3", "phi3")):
        model = _model(kind, tok)
        path = _write(model, tok, tiny_model, tmp_path / kind, "bf16")
        fields, tensors = _fields(path), _tensors(path)
        assert fields["general.architecture"] == arch
        known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[
            next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)] for i in range(2)}
        assert {n.rsplit(".", 1)[0] for n in tensors} <= known
        sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
        if arch == "qwen3":
            assert fields["qwen3.attention.key_length"] == fields["qwen3.attention.value_length"] == 128
            assert np.array_equal(tensors["blk.0.attn_q_norm.weight"][0], sd["model.layers.0.self_attn.q_norm.weight"])
            assert fields["tokenizer.ggml.pre"] == "gpt-2"  # the fixture's split (GPT-2's), not Qwen's
        if arch == "gemma3":  # every norm + 1, F32; no output (tied); the window and both rope bases
            for hf, name in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attention_norm"),
                             ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm"),
                             ("self_attn.k_norm", "attn_k_norm")):
                data, kind_ = tensors[f"blk.1.{name}.weight"]
                assert kind_ == "F32" and np.allclose(data, sd[f"model.layers.1.{hf}.weight"] + 1, atol=1e-7, rtol=0)
            assert "output.weight" not in tensors and fields["gemma3.attention.sliding_window"] == 8
            assert fields["gemma3.rope.freq_base"] == 1e6 and fields["gemma3.rope.freq_base_swa"] == 1e4
            assert fields["gemma3.attention.key_length"] == 256
        if arch == "phi3":  # fused as in the checkpoint: qkv rows q, k, v; ffn_up rows gate, up
            assert tensors["blk.0.attn_qkv.weight"][0].shape == (32 + 2 * 16, 32)
            assert tensors["blk.0.ffn_up.weight"][0].shape == (2 * 64, 32)
            assert fields["phi3.rope.dimension_count"] == 8 and fields["phi3.attention.sliding_window"] == 0
            assert fields["phi3.rope.scaling.original_context_length"] == 4096
            assert "phi3.attention.key_length" not in fields


# ---------------------------------------------------------------------------- only llama.cpp reads these back
def test_smollm3_is_llamas_file_under_its_own_name(tmp_path, tok, tiny_model):
    """SmolLM3Model(LlamaModel): q/k permuted, vocab_size and rope.dimension_count, tied head left out; its no-rope
    layers are llama.cpp's own rule (every fourth), so only that layout is written."""
    model = _model("smollm3", tok, num_hidden_layers=4)
    assert model.config.no_rope_layers == [1, 1, 1, 0]
    path = _write(model, tok, tiny_model, tmp_path, "f16")
    fields, tensors = _fields(path), _tensors(path)
    assert fields["general.architecture"] == "smollm3" and fields["smollm3.vocab_size"] == len(tok)
    assert fields["smollm3.rope.dimension_count"] == 8 and fields["smollm3.rope.freq_base"] == 2e6
    assert "output.weight" not in tensors and len(tensors) == 2 + 4 * 9  # token_embd, output_norm, 9 per layer
    q = model.state_dict()["model.layers.3.self_attn.q_proj.weight"].half().float().numpy()
    k = model.state_dict()["model.layers.3.self_attn.k_proj.weight"].half().float().numpy()
    assert np.array_equal(tensors["blk.3.attn_q.weight"][0], gguf_arch.permute_rope(q, 4))
    assert np.array_equal(tensors["blk.3.attn_k.weight"][0], gguf_arch.permute_rope(k, 2))
    assert "does not read the architecture smollm3" in gguf_arch.misread(model.config, tmp_path, path.name)
    odd = _model("smollm3", tok, num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1])
    with pytest.raises(gguf_mod.GGUFError, match="no_rope_layers are not llama.cpp's"):
        _write(odd, tok, tiny_model, tmp_path / "odd", "f16")


def test_llama3_rope_scaling_is_the_rope_freqs_tensor(tmp_path, tok, tiny_model):
    """llama.cpp divides each rotary frequency by rope_freqs: it must be transformers' default frequencies over its
    llama3-scaled ones (wavelengths 2 pi x {1, 10, 100, 1000} against 64 / 4 and 64 / 1: one kept, one smoothed,
    two divided by 8)."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    model = _model("llama", tok, rope_parameters=rope)
    path = _write(model, tok, tiny_model, tmp_path, "bf16")
    (freqs, kind), first = _tensors(path)["rope_freqs.weight"], next(iter(_tensors(path)))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, torch.device("cpu"))
    default = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    assert first == "rope_freqs.weight" and kind == "F32"  # the converter writes it before the weights
    assert np.allclose(freqs, (default / scaled).numpy(), rtol=1e-6, atol=0)
    assert freqs[0] == 1.0 and 1.0 < freqs[1] < 8.0 and list(freqs[2:]) == [8.0, 8.0]
    assert "rope_parameters" in gguf_arch.misread(model.config, tmp_path, path.name)  # its loader drops the scaling


def test_linear_and_yarn_rope_scaling_are_keys(tmp_path, tok, tiny_model):
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256, beta_fast=32.0,
                beta_slow=1.0)
    fields = _fields(_write(_model("qwen3", tok, rope_parameters=yarn), tok, tiny_model, tmp_path / "y", "bf16"))
    assert fields["qwen3.rope.scaling.type"] == "yarn" and fields["qwen3.rope.scaling.factor"] == 4.0
    assert fields["qwen3.rope.scaling.original_context_length"] == 256
    assert fields["qwen3.rope.scaling.yarn_beta_fast"] == 32.0 and fields["qwen3.rope.scaling.yarn_beta_slow"] == 1.0
    linear = dict(rope_type="linear", rope_theta=10000.0, factor=2.0)
    fields = _fields(_write(_model("llama", tok, rope_parameters=linear), tok, tiny_model, tmp_path / "l", "bf16"))
    assert fields["llama.rope.scaling.type"] == "linear" and fields["llama.rope.scaling.factor"] == 2.0
    assert "rope_freqs.weight" not in _tensors(tmp_path / "l" / "m-bf16.gguf")


def test_phi3_longrope_and_partial_rotary(tmp_path, tok, tiny_model):
    """Phi-4-mini's shape: half the head rotates (rope.dimension_count 4 of 8), longrope factors as F32 tensors and
    attn_factor sqrt(1 + ln(1024 / 256) / ln 256), as Phi3MiniModel computes it (transformers computes the same)."""
    rope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5, short_factor=[1.0, 1.5],
                long_factor=[2.0, 3.0])
    model = _model("phi3", tok, rope_parameters=rope, original_max_position_embeddings=256)
    path = _write(model, tok, tiny_model, tmp_path, "bf16")
    fields, tensors = _fields(path), _tensors(path)
    assert fields["phi3.rope.dimension_count"] == 4 and fields["phi3.rope.scaling.original_context_length"] == 256
    assert math.isclose(fields["phi3.rope.scaling.attn_factor"], math.sqrt(1 + math.log(4) / math.log(256)),
                        rel_tol=1e-6)
    assert list(tensors["rope_factors_long.weight"][0]) == [2.0, 3.0]
    assert list(tensors["rope_factors_short.weight"][0]) == [1.0, 1.5]
    assert "rope_parameters" in gguf_arch.misread(model.config, tmp_path, path.name)


def test_pre_tokenizer_names_follow_the_split():
    """The names llama.cpp's hash table gives these families, told by the split their tokenizer.json makes (the
    regexes as transformers rebuilds them from the name, so a file round-trips); a plain GPT-2 byte level: gpt2."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS as SPLITS

    def named(pre) -> str:
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre
        return gguf_mod.pre_tokenizer_name(json.loads(tk.to_str()))

    for name in ("qwen2", "llama-bpe", "gpt-4o"):
        split = pre_tokenizers.Split(Regex(SPLITS[name]), behavior="isolated")
        assert named(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(use_regex=False)])) == name
    assert named(pre_tokenizers.ByteLevel(add_prefix_space=False)) == "gpt-2"
    digits = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel()])
    assert named(digits) == "smollm"


# ---------------------------------------------------------------------------- refused, in one sentence
def test_what_llama_cpp_would_misread_is_refused(tmp_path, tok, tiny_model):
    cases = [("gemma3_text", dict(query_pre_attn_scalar=128), "query_pre_attn_scalar"),
             ("gemma3_text", dict(layer_types=["full_attention"] * 2), "layer_types"),
             ("gemma3_text", dict(attn_logit_softcapping=50.0), "caps attention logits"),
             ("llama", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "'dynamic'"),
             ("qwen3", dict(rope_parameters=dict(rope_type="llama3", rope_theta=1e4, factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0, original_max_position_embeddings=16)),
              "'llama3'.*qwen3.*default, linear, yarn")]
    for kind, fields, match in cases:
        with pytest.raises(gguf_mod.GGUFError, match=f"{match}.*export --format hf") as e:
            _write(_model(kind, tok, **fields), tok, tiny_model, tmp_path, "bf16")
        assert str(e.value).count(". ") == 0  # one sentence
    with pytest.raises(gguf_mod.GGUFError, match="q4_k_m of a phi3.*Q5_K"):
        gguf_mod.check_request("phi3", "q4_k_m")
    with pytest.raises(gguf_mod.GGUFError, match="llama, mistral, qwen2, qwen3, gemma3_text, smollm3, phi3;"):
        gguf_mod.check_request("gpt_neox", "bf16")


# ---------------------------------------------------------------------------- cpu-grpo export, end to end
@pytest.fixture(scope="module")
def runs(tmp_path_factory, tok, tiny_model):
    """2-step full runs of a tiny qwen3 (read back by transformers) and smollm3 (not)."""
    from cpu_grpo import config
    from cpu_grpo.train.loop import train
    from tests.conftest import REWARD

    root = tmp_path_factory.mktemp("arch-runs")
    (root / "my_rewards.py").write_text(REWARD)
    out = {}
    for kind, fields in (("qwen3", {}), ("smollm3", dict(num_hidden_layers=4))):
        model_dir = root / f"tiny-{kind}"
        _model(kind, tok, **fields).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        values = dict(model=str(model_dir), output_dir=str(root / kind), steps=2, prompts_per_step=2,
                      num_generations=4, max_new_tokens=8, eval_size=4, eval_max_new_tokens=8, save_every=2,
                      rewards=[f"{root / 'my_rewards.py'}:length_reward"], reward_weights=[1.0], learning_rate=1e-2,
                      train_size=40, score_truncated=True, instruction="Answer with '#### N'.")
        train(config.build(None, None, values), log=lambda *a: None)
        out[kind] = root / kind
    return out


def test_export_of_a_qwen3_run_is_checked_by_transformers(runs, tmp_path, monkeypatch):
    from cpu_grpo.export import readback
    from cpu_grpo.export.run import Request, export

    monkeypatch.setattr(readback, "has_llama_cpp", lambda: False)  # read back by transformers, as without llama.cpp

    result = export(Request(spec=str(runs["qwen3"]), format="gguf", out=str(tmp_path / "q")), log=lambda *a: None)
    greedy = result.checks["greedy"]
    assert result.passed and greedy["prompt_tokens_identical"], result.checks
    assert greedy["identical"] == greedy["prompts"] == 20 and greedy["max_logit_diff"] < 1e-4, greedy


def test_an_export_transformers_cannot_read_says_so_and_exports_unverified(runs, tmp_path, monkeypatch):
    """smollm3: transformers' GGUF loader does not know it. Without llama.cpp: one sentence that claims no reader,
    nothing left, then --no-verify; with llama.cpp installed, llama.cpp itself reads it as the check."""
    from cpu_grpo.export import readback
    from cpu_grpo.export.run import Request, export

    out = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(readback, "has_llama_cpp", lambda: False)
        with pytest.raises(gguf_mod.GGUFError, match="written but cannot be checked here .transformers' GGUF loader "
                                                     "does not read the architecture smollm3., and llama.cpp is not "
                                                     "installed to read it.*--no-verify"):
            export(Request(spec=str(runs["smollm3"]), format="gguf", out=str(out)), log=lambda *a: None)
    assert not out.exists() and not list(tmp_path.glob(".s.partial-*"))
    export(Request(spec=str(runs["smollm3"]), format="gguf", out=str(out), verify=False), log=lambda *a: None)
    assert "Not verified" in (out / "export.md").read_text() and list(out.glob("*.gguf"))
    if readback.has_llama_cpp():
        result = export(Request(spec=str(runs["smollm3"]), format="gguf", out=str(tmp_path / "c")),
                        log=lambda *a: None)
        assert set(result.checks) == {"llama.cpp", "template"} and result.passed, str(result.checks)


def test_a_field_that_defaults_to_the_same_value_is_no_misreading(tmp_path, tok, tiny_model):
    """Qwen2 with head_dim named in config.json (as hidden_size / heads): transformers' loader leaves it out and
    runs the same head size; the export was refused as unreadable ("reads its head_dim as None, not 8")."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**COMMON, head_dim=8, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    path = _write(Qwen2ForCausalLM(config).eval(), tok, tiny_model, tmp_path, "q8_0")
    assert gguf_arch.misread(config, tmp_path, path.name) is None
    config.head_dim = 16  # a head size the file's shapes would not give: still said
    assert "head_dim" in gguf_arch.misread(config, tmp_path, path.name)
