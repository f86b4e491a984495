"""Export (src/cpu_grpo/export/): every format round-trips from tiny full and LoRA runs, the checks pass, and bad
input ends in one sentence with nothing left behind."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import pytest

from cpu_grpo import config
from cpu_grpo.errors import UserError
from cpu_grpo.export import gguf as gguf_mod
from cpu_grpo.export import prompt
from cpu_grpo.export.run import Request, export

INSTRUCTION = "Answer with '#### N'."


def _train(model: str, out: Path, reward: Path, **kw) -> Path:
    from cpu_grpo.train.loop import train

    values = dict(model=model, output_dir=str(out), steps=2, prompts_per_step=2, num_generations=4, max_new_tokens=8,
                  eval_size=4, eval_max_new_tokens=8, save_every=2, rewards=[f"{reward}:length_reward"],
                  reward_weights=[1.0], learning_rate=1e-2, train_size=40, score_truncated=True,
                  **{"instruction": INSTRUCTION, **kw})
    train(config.build(None, None, values), log=lambda *a: None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, tiny_qwen):
    """A full and a LoRA run of the tiny llama, and a full run of the tiny qwen2 (2 steps each)."""
    from tests.conftest import REWARD

    root = tmp_path_factory.mktemp("export-runs")
    reward = root / "my_rewards.py"
    reward.write_text(REWARD)
    return {"full": _train(tiny_model, root / "full", reward),
            "lora": _train(tiny_model, root / "lora", reward, use_lora=True, lora_r=4, lora_alpha=8),
            "qwen2": _train(tiny_qwen, root / "qwen2", reward)}


def _quiet(**kw) -> Request:
    return Request(**kw)


def _digest(path: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())).hexdigest()


# ---------------------------------------------------------------------------- pieces
def test_tensor_names_follow_llama_cpp():
    assert gguf_mod.gguf_name("model.embed_tokens.weight", 2) == "token_embd.weight"
    assert gguf_mod.gguf_name("model.layers.1.self_attn.q_proj.bias", 2) == "blk.1.attn_q.bias"
    assert gguf_mod.gguf_name("model.layers.0.mlp.down_proj.weight", 2) == "blk.0.ffn_down.weight"
    assert gguf_mod.gguf_name("model.layers.0.post_attention_layernorm.weight", 2) == "blk.0.ffn_norm.weight"
    assert gguf_mod.gguf_name("model.rotary_emb.inv_freq", 2) is None


def test_rope_permutation_is_undone_by_transformers():
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    assert not np.array_equal(gguf_mod.permute_rope(w, 2), w)
    back = LlamaTensorProcessor(config={})._reverse_permute_weights(gguf_mod.permute_rope(w, 2), 2, 2)
    assert np.array_equal(back, w)


def test_template_appends_the_instruction_once(tiny_model):
    from transformers import AutoTokenizer

    from cpu_grpo.engine.prompts import encode_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model)
    template = prompt.with_instruction(tok.chat_template, INSTRUCTION)
    asked = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                    add_generation_prompt=True, chat_template=template)
    assert tok(asked, add_special_tokens=False)["input_ids"] == encode_prompts(tok, ["What is 2 + 3?"], INSTRUCTION)[0]
    again = tok.apply_chat_template([{"role": "user", "content": f"What is 2 + 3?\n{INSTRUCTION}"}], tokenize=False,
                                    add_generation_prompt=True, chat_template=template)
    assert again == asked  # a user who typed the instruction does not get it twice
    assert prompt.with_instruction(template, INSTRUCTION) == template


# ---------------------------------------------------------------------------- every format, full and LoRA runs
@pytest.mark.parametrize("run,fmt,quant", [("full", "hf", ""), ("lora", "hf", "bf16"), ("lora", "peft", ""),
                                           ("full", "gguf", "bf16"), ("lora", "gguf", "f16"),
                                           ("qwen2", "gguf", "bf16"), ("qwen2", "hf", "")])
def test_exact_formats_round_trip(runs, tmp_path, run, fmt, quant, monkeypatch):
    from cpu_grpo.export import readback

    monkeypatch.setattr(readback, "has_llama_cpp", lambda: False)  # a GGUF read back by transformers, as without it
    out = tmp_path / "out"
    before = _digest(runs[run] / "checkpoints")
    result = export(_quiet(spec=str(runs[run]), format=fmt, quant=quant, out=str(out)), log=lambda *a: None)
    greedy = result.checks["greedy"]
    assert result.passed and greedy["prompt_tokens_identical"]
    assert greedy["identical"] == greedy["prompts"] == 20  # the run's 4 held-out problems, then more of its test split
    assert greedy["max_logit_diff"] < 1e-4
    assert result.checks["template"]["carries_instruction"]
    text = (out / "export.md").read_text()
    assert INSTRUCTION in text and "Verification passed" in text and "step 2" in text
    assert not list(tmp_path.glob(".out.partial-*")) and _digest(runs[run] / "checkpoints") == before


def test_hf_export_loads_with_plain_transformers(runs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "hf"
    export(_quiet(spec=str(runs["full"]), format="hf", out=str(out), verify=False), log=lambda *a: None)
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert model.generation_config.do_sample is False and tok.eos_token_id in (
        model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id])
    assert "Not verified" in (out / "export.md").read_text()


def test_peft_export_loads_on_its_base(runs, tmp_path, tiny_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    export(_quiet(spec=str(runs["lora"]), format="peft", out=str(out), verify=False), log=lambda *a: None)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in out.iterdir()}
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out)
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_quantized_gguf_is_checked_by_accuracy_and_gets_a_modelfile(runs, tmp_path, monkeypatch):
    from cpu_grpo.engine import progress
    from cpu_grpo.export import readback

    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)  # the long phases say how far they are, with a rate
    out, said = tmp_path / "q8", []
    result = export(_quiet(spec=str(runs["full"]), format="gguf", quant="q8_0", out=str(out), ollama="tiny-model",
                           verify_n=6), log=said.append)
    assert any("writing q8_0: tensor" in x and "tensors/s" in x for x in said), said
    assert any("problems/s, about" in x for x in said), said
    acc = result.checks["accuracy"]
    assert acc["n"] == 6 and 0 <= acc["export"] <= 1 and acc["comparison"]["n"] == 6
    assert acc["reader"] == ("llama.cpp" if readback.has_llama_cpp() else "transformers")
    modelfile = (out / "Modelfile").read_text()
    gguf_file = next(out.glob("*.gguf")).name
    assert f"FROM ./{gguf_file}" in modelfile and "{{ .Prompt }}" in modelfile and INSTRUCTION in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "PARAMETER temperature 0.7" in modelfile
    assert "ollama create tiny-model" in result.command and str(out) in result.command
    assert "McNemar" in (out / "export.md").read_text()


def test_the_accuracy_check_judges_rows_of_your_own_task_by_their_correct_reward(tiny_model):
    """A code row is right when the run's correct reward scores it 1, as the run's evaluation judges it, not by a
    math answer read from its text (the export's check did that before: every code row counted wrong)."""
    from cpu_grpo.data import generated
    from cpu_grpo.engine.models import load_model
    from cpu_grpo.eval.evaluate import Judge
    from cpu_grpo.export import verify

    model, tok = load_model(tiny_model, log=lambda *a: None)
    rows = generated.generate_task("code", 3, seed=0, split="test")
    seen = []

    def right(completions, **kw):
        seen.extend(completions)
        return [1.0] * len(completions)

    judged = verify.answers(verify.greedy(model, tok, 4), tok, tok.chat_template, rows, ("", ""), log=lambda *a: None,
                            judge=Judge(right, True))
    assert [r["correct"] for r in judged] == [True] * 3 and seen == [r["completion"] for r in judged]
    with pytest.raises(UserError, match="--correct-reward"):  # no reward to judge them by: said, not counted wrong
        verify.answers(verify.greedy(model, tok, 4), tok, tok.chat_template, rows, ("", ""), log=lambda *a: None)


def test_the_instruction_travels_only_where_the_run_appended_it(tmp_path):
    """The run appends its instruction to math questions only (example.Example.chat): a code run's export is asked,
    checked and templated without it, a math run's with it."""
    from cpu_grpo.export.source import Source

    asked = {task: Source(tmp_path, None, {"task": task, "instruction": INSTRUCTION}).instruction
             for task in ("code", "countdown", "basic", "advanced+gsm8k")}
    assert asked == {"code": "", "countdown": "", "basic": INSTRUCTION, "advanced+gsm8k": INSTRUCTION}


def test_q4_0_writes_4_bit_blocks_and_8_bit_embeddings(runs, tmp_path):
    from gguf import GGUFReader

    out = tmp_path / "q4"
    export(_quiet(spec=str(runs["full"]), format="gguf", quant="q4_0", out=str(out), verify=False),
           log=lambda *a: None)
    types = {t.name: t.tensor_type.name for t in GGUFReader(next(out.glob("*.gguf"))).tensors}
    assert types["token_embd.weight"] == "Q8_0" and types["blk.0.ffn_up.weight"] == "Q4_0"
    assert types["blk.0.attn_norm.weight"] == "F32"


# ---------------------------------------------------------------------------- bad input: one sentence
def test_a_run_without_a_checkpoint_says_how_to_get_one(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "train_config.yaml").write_text("model: x\n")
    with pytest.raises(UserError, match="no complete checkpoint yet.*--resume"):
        export(_quiet(spec=str(run)), log=lambda *a: None)


def test_unknown_architecture_and_quantization_name_what_is_known():
    with pytest.raises(UserError, match="llama, mistral, qwen2"):
        gguf_mod.check_request("gpt2", "bf16")
    with pytest.raises(UserError, match="K-quant mixes.*bf16, f16, q8_0, q4_k_m, q4_0"):
        gguf_mod.check_request("llama", "q5_k_m")
    with pytest.raises(UserError, match="--ollama needs --format gguf"):
        export(_quiet(spec=".", format="hf", ollama="x"), log=lambda *a: None)


def test_peft_of_a_full_run_is_refused(runs, tmp_path):
    with pytest.raises(UserError, match="full fine-tune, not LoRA"):
        export(_quiet(spec=str(runs["full"]), format="peft", out=str(tmp_path / "x")), log=lambda *a: None)


def test_an_existing_output_is_refused_unless_overwrite(runs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="exists.*--overwrite"):
        export(_quiet(spec=str(runs["full"]), format="gguf", out=str(out), verify=False), log=lambda *a: None)
    assert (out / "mine.txt").read_text() == "keep"
    said = []
    export(_quiet(spec=str(runs["full"]), format="gguf", out=str(out), verify=False, overwrite=True),
           log=said.append)
    assert not (out / "mine.txt").exists() and list(out.glob("*.gguf"))
    moved = next(tmp_path.glob("out.before-export-*"))  # what was there is kept, and said
    assert (moved / "mine.txt").read_text() == "keep" and f"moved what was at {out} to {moved} (--overwrite)" in said
    export(_quiet(spec=str(runs["full"]), format="gguf", out=str(out), verify=False, overwrite=True),
           log=said.append)
    assert f"replaced the earlier export at {out}" in said and not list(tmp_path.glob(".out.old-*"))
    (tmp_path / "file.gguf").write_text("mine")  # a file of yours, likewise
    export(_quiet(spec=str(runs["full"]), format="gguf", out=str(tmp_path / "file.gguf"), verify=False,
                  overwrite=True), log=said.append)
    assert next(tmp_path.glob("file.gguf.before-export-*")).read_text() == "mine"


def test_an_export_never_replaces_a_run_its_own_checkpoint_or_the_folder_you_are_in(runs, tmp_path, monkeypatch):
    """`export runs/X/checkpoints/step-N --format hf --out runs/X --overwrite` replaced the whole run, the
    checkpoint being exported included; `--out . --overwrite` stopped with a ValueError after the work."""
    ckpt = sorted((runs["full"] / "checkpoints").glob("step-*"))[-1]
    before = _digest(runs["full"])
    monkeypatch.chdir(tmp_path)
    for out, words in [(runs["full"], "holds the checkpoint being exported"), (ckpt, "holds the checkpoint"),
                       (runs["full"].parent, "holds the checkpoint"), (".", "is the folder you are in")]:
        with pytest.raises(UserError, match=words + ".*an export never replaces it"):
            export(_quiet(spec=str(ckpt), format="hf", out=str(out), verify=False, overwrite=True),
                   log=lambda *a: None)
    with pytest.raises(UserError, match=r"holds a training run \(metrics.jsonl\)"):
        export(_quiet(spec=str(ckpt), format="hf", out=str(runs["lora"]), verify=False, overwrite=True),
               log=lambda *a: None)
    assert _digest(runs["full"]) == before


def test_a_full_disk_removes_the_partial_files_and_leaves_the_checkpoint(runs, tmp_path, monkeypatch):
    before = _digest(runs["full"] / "checkpoints")

    def fill(model, tok, tok_dir, path, *a, **kw):
        Path(path).write_bytes(b"GGUF" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf_mod, "write", fill)
    with pytest.raises(UserError, match="disk filled.*removed the partial files.*untouched"):
        export(_quiet(spec=str(runs["full"]), format="gguf", out=str(tmp_path / "out")), log=lambda *a: None)
    assert list(tmp_path.iterdir()) == [] and _digest(runs["full"] / "checkpoints") == before


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KB tmpfs, and the same read-only (root mounts them, as CI runs)."""
    import os
    import subprocess

    disks = {"full": tmp_path / "full", "ro": tmp_path / "ro"}
    for name, where in disks.items():
        where.mkdir()
        options = "size=64k" + (",ro" if name == "ro" else "")
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                               capture_output=True).returncode:
            pytest.skip("mounting a small tmpfs needs root (run the suite as root, as CI does)")
    yield disks
    for where in disks.values():
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_export_onto_a_full_or_read_only_disk_is_one_sentence(runs, small_disk):
    """--format hf onto a full disk raised safetensors' SafetensorError (not an OSError, so the full-disk sentence
    was skipped); a read-only folder raised EROFS's traceback."""
    from cpu_grpo.cli import main

    before = _digest(runs["full"] / "checkpoints")
    with pytest.raises(UserError, match="the disk filled while writing the export.*removed the partial files"):
        export(_quiet(spec=str(runs["full"]), format="hf", out=str(small_disk["full"] / "hf"), verify=False),
               log=lambda *a: None)
    assert list(small_disk["full"].iterdir()) == [] and _digest(runs["full"] / "checkpoints") == before
    assert main(["export", str(runs["full"]), "--format", "gguf", "--out", str(small_disk["ro"] / "x")]) == 2
    with pytest.raises(UserError, match=r"cannot write into .*/ro \(Read-only file system\): choose another --out"):
        export(_quiet(spec=str(runs["full"]), format="gguf", out=str(small_disk["ro"] / "x")), log=lambda *a: None)


@pytest.mark.slow
def test_an_export_of_a_task_of_your_own_carries_its_rows_prompt(tiny_model, tmp_path):
    """A run on chat rows that each carry one system prompt: the Modelfile's SYSTEM was the base model's default
    and export.md's example a math word problem (asked so, the export answered 0 of 20 like the checkpoint); and
    export.md said the template was left as the checkpoint's (--keep-template) with no such flag given."""
    import json

    from tests.conftest import REWARD

    system = "Answer with the capital only, in <answer> tags."
    rows = [{"prompt": [{"role": "system", "content": system},
                        {"role": "user", "content": f"What is the capital of country number {i}?"}], "answer": "x"}
            for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "r.py").write_text(REWARD)
    run = tmp_path / "run"
    _train(tiny_model, run, tmp_path / "r.py", task=str(tmp_path / "rows.jsonl"), instruction="")
    export(_quiet(spec=str(run), format="gguf", quant="q8_0", out=str(tmp_path / "out"), ollama="mine",
                  verify=False), log=lambda *a: None)
    modelfile, card_text = (tmp_path / "out" / "Modelfile").read_text(), (tmp_path / "out" / "export.md").read_text()
    assert system in modelfile  # as SYSTEM, or in TEMPLATE where the template writes no system turn of its own
    assert "What is the capital of country number" in card_text and "apples" not in card_text
    assert f"and with this system prompt first: `{system}`" in card_text
    assert "--keep-template" not in card_text and "The run appended no instruction" in card_text


def test_cli_export_defaults_to_the_runs_exports_directory(runs, capsys):
    from cpu_grpo.cli import main

    assert main(["export", str(runs["qwen2"]), "--format", "gguf", "--quant", "f16", "--no-verify"]) == 0
    written = list((runs["qwen2"] / "exports").glob("gguf-f16-step*/*.gguf"))
    assert len(written) == 1 and "export.md" in capsys.readouterr().out
    assert main(["export", str(runs["qwen2"]), "--format", "gguf", "--quant", "q3_k_m"]) == 2
    assert "bf16, f16, q8_0, q4_k_m, q4_0" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the real demo model
@pytest.mark.realmodel
@pytest.mark.slow
def test_real_model_q8_0_export_keeps_its_accuracy(tmp_path, monkeypatch):
    """SmolLM2-135M trained one step, exported to q8_0 and checked on 40 held-out problems: the export is not
    significantly worse than the checkpoint (McNemar p >= 0.05), the check's own rule. Read by llama.cpp (int8
    weights and int8 activations, what ollama runs) it is closer to the edge than transformers' reading of the same
    file (int8 weights, fp32 activations): 22.5% -> 10.0% (5 lost, 0 gained, p 0.06) against 22.5% -> 17.5% (p 0.63),
    2026-12-04; the default 0.5B model kept its accuracy through llama.cpp (69.0% vs 68.0% on 200, p 0.73)."""
    from cpu_grpo.engine.models import ModelError, resolve_model
    from cpu_grpo.train.loop import train

    monkeypatch.setenv("CPU_GRPO_CACHE", str(Path.home() / ".cache" / "cpu-grpo"))
    try:
        resolve_model("smollm2-135m", log=lambda *a: None)
    except ModelError as e:
        pytest.skip(f"default model not available: {e}")
    run = train(config.build("quick", None, dict(output_dir=str(tmp_path / "run"), steps=1, prompts_per_step=2,
                                                 num_generations=4, max_new_tokens=24, eval_size=0,
                                                 eval_max_new_tokens=96)), log=lambda *a: None)
    result = export(_quiet(spec=str(run), format="gguf", quant="q8_0", out=str(tmp_path / "q8"), verify_n=40),
                    log=lambda *a: None)
    acc = result.checks["accuracy"]
    not_worse = acc["comparison"]["p_value"] >= 0.05 or acc["export"] >= acc["checkpoint"]
    assert result.passed and not_worse and acc["n"] == 40, acc


# ---------------------------------------------------------------------------- the web page's Export action
def test_the_page_exports_a_finished_runs_checkpoint_into_the_run(runs, monkeypatch):
    from cpu_grpo.app import handlers
    from cpu_grpo.app.policy import Policy

    root = runs["full"].parent
    policy = Policy(root)
    ckpt = str(sorted((runs["full"] / "checkpoints").glob("step-*"))[-1])
    *_, (log, card) = handlers.export(policy, "full", ckpt, "gguf", "bf16", "tiny-full")
    assert "Verification passed" in card and "ollama create tiny-full" in card, log
    assert list((runs["full"] / "exports").glob("gguf-bf16-step-*/Modelfile"))
    other = str(sorted((runs["lora"] / "checkpoints").glob("step-*"))[-1])
    *_, (refused, _) = handlers.export(policy, "full", other, "gguf", "bf16", "")
    assert "checkpoints of the chosen run only" in refused
    assert "outside the runs directory" in policy.export_problem(runs["full"], ckpt, root.parent / "elsewhere")


# ---------------------------------------------------------------------------- K-quants (not in the gguf package)
def test_k_quant_blocks_read_back_with_ggufs_own_dequantize():
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from cpu_grpo.export import kquants

    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32) * 0.05
    x[0, :256] = np.abs(x[0, :256])  # a block with no negative value: min 0
    x[1] = 0.0  # a block of zeros: scales 0, no division by zero
    for quantize, qtype, rel in ((kquants.quantize_q4_k, T.Q4_K, 0.09), (kquants.quantize_q6_k, T.Q6_K, 0.025)):
        back = dequantize(quantize(x), qtype)
        assert back.shape == x.shape and np.all(back[1] == 0)
        assert np.sqrt(((back - x) ** 2).mean()) / x.std() < rel  # Q4_0 here: 0.085, Q5_0: 0.041, Q8_0: 0.005


def test_q4_k_m_picks_llama_quantizes_types(tmp_path, tiny_model):
    """A 2-layer model with rows of 256: Q4_K, Q6_K for attn_v/ffn_down of the last layer and the tied head's
    embeddings (llama.cpp's use_more_bits), Q5_0 where a row is not a multiple of 256; read back by transformers."""
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=320,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True)).eval()
    path = tmp_path / "m.gguf"
    gguf_mod.write(model, tok, Path(tiny_model), path, "q4_k_m", "tiny", tok.chat_template)
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["blk.0.attn_v.weight"] == "Q4_K"
    assert types["blk.1.attn_v.weight"] == "Q6_K" and types["token_embd.weight"] == "Q6_K"
    assert types["blk.0.ffn_down.weight"] == "Q5_0"  # rows of 320
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32)
    w, v = model.model.layers[0].self_attn.q_proj.weight, back.model.layers[0].self_attn.q_proj.weight
    assert float((w - v).pow(2).mean().sqrt() / w.std()) < 0.09  # rope permutation undone, blocks in place


def test_modelfile_template_keeps_the_default_system_prompt(tiny_model):
    """A ChatML template that adds a system turn when none is given (SmolLM2's, Qwen's): TEMPLATE gets {{ .System }}
    and SYSTEM the default, so that Ollama renders the run's prompt exactly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    template = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\nBe "
                "brief.<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'"
                " }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    go, system = prompt.single_turn(tok, template, INSTRUCTION)
    assert system == "Be brief." and go == ("<|im_start|>system\n{{ .System }}<|im_end|>\n<|im_start|>user\n"
                                            f"{{{{ .Prompt }}}}\n{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.single_turn(tok, template, INSTRUCTION, "Think.")[1] == "Think."  # the run's own system prompt


# ---------------------------------------------------------------------------- llama.cpp itself reads the file
@pytest.mark.parametrize("run", ["full", "qwen2"])
def test_llama_cpp_reads_the_gguf_as_the_checkpoint(runs, tmp_path, run):
    """llama.cpp (llama-cpp-python, compiled from PyPI's source package) tokenizes the prompt the checkpoint's
    tokenizer does, computes its logits at every position, and renders the run's instruction from the stored
    chat template."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (it compiles llama.cpp)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    export(_quiet(spec=str(runs[run]), format="gguf", quant="f16", out=str(out), verify=False), log=lambda *a: None)
    from cpu_grpo.engine.llamacpp import high_level

    llm = high_level(next(out.glob("*.gguf")), n_ctx=256, logits_all=True, verbose=False)
    ckpt = sorted((runs[run] / "checkpoints").glob("step-*"))[-1]
    tok, model = AutoTokenizer.from_pretrained(ckpt), AutoModelForCausalLM.from_pretrained(ckpt).eval()
    asked = tok.apply_chat_template(prompt.messages("What is 12 + 30?", INSTRUCTION, ""), tokenize=False,
                                    add_generation_prompt=True)
    ids = tok(asked, add_special_tokens=False)["input_ids"]
    assert llm.tokenize(asked.encode(), add_bos=False, special=True) == ids
    llm.eval(ids)
    theirs = torch.tensor(llm.scores[:len(ids)])
    with torch.no_grad():
        from cpu_grpo.export.verify import round_to

        round_to(model, torch.float16, matrices_only=True)  # what an f16 file holds
        mine = model(torch.tensor([ids])).logits[0]
    assert (theirs - mine).abs().max() < 1e-2 * mine.abs().max()
    assert torch.equal(theirs.argmax(-1), mine.argmax(-1))
    bare = llm.create_chat_completion([{"role": "user", "content": "What is 12 + 30?"}], max_tokens=1)
    assert bare["usage"]["prompt_tokens"] == len(ids)  # the template added the instruction


@pytest.mark.parametrize("quant", ["bf16", "q8_0"])
def test_where_llama_cpp_is_installed_it_alone_reads_the_gguf(runs, tmp_path, monkeypatch, quant):
    """transformers' GGUF reader held a second, fp32, copy of the weights beside the checkpoint (the 0.5B export
    peaked at 7.9 GiB, 5.3 of it the reader): where llama.cpp is installed it is the only reader, its batched greedy
    answers the quantized file's accuracy check."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (it compiles llama.cpp)")
    from cpu_grpo.export import readback

    def refuse(*a, **kw):
        raise AssertionError("transformers was asked to read the export")

    monkeypatch.setattr(readback, "load_written", refuse)
    result = export(_quiet(spec=str(runs["full"]), format="gguf", quant=quant, out=str(tmp_path / "out"),
                           verify_n=6), log=lambda *a: None)
    assert result.passed and set(result.checks) == {"llama.cpp", "template"} | ({"accuracy"} if quant == "q8_0"
                                                                                 else set()), result.checks
    assert result.checks["template"]["carries_instruction"]
    if quant == "q8_0":
        acc = result.checks["accuracy"]
        assert acc["reader"] == "llama.cpp" and acc["n"] == 6 and "read by llama.cpp" in (
            tmp_path / "out" / "export.md").read_text()


def test_llama_cpp_batched_greedy_equals_one_row_at_a_time(runs, tmp_path):
    """engine.llamacpp decodes many rows as one llama.cpp batch, a KV stream a row: a row's greedy completion does
    not depend on the rows beside it."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (it compiles llama.cpp)")
    from transformers import AutoTokenizer

    from cpu_grpo.engine.llamacpp import LlamaCpp

    out = tmp_path / "out"
    export(_quiet(spec=str(runs["full"]), format="gguf", quant="f16", out=str(out), verify=False), log=lambda *a: None)
    tok = AutoTokenizer.from_pretrained(out, gguf_file=next(out.glob("*.gguf")).name)
    prompts = [tok(f"What is {a} + {b}?", add_special_tokens=False)["input_ids"] for a, b in [(1, 2), (30, 4), (5, 60)]]
    with LlamaCpp(next(out.glob("*.gguf")), 3, 64, 1, batch=8) as llm:  # prompts longer than a batch: in pieces
        together, logps = llm.generate(prompts, 1, 12, 0.0, (tok.eos_token_id,))
        alone = [llm.generate([p], 1, 12, 0.0, (tok.eos_token_id,))[0][0] for p in prompts]
    assert together == alone and all(len(x) == len(y) for x, y in zip(together, logps, strict=True))
    assert all(0 < len(x) <= 12 for x in together) and max(map(len, prompts)) > 8


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama3-rope", "phi3"])
def test_a_gguf_is_checked_by_llama_cpp_where_transformers_cannot_read_it_back(kind, tiny_model, tmp_path):
    """Every Llama 3.x (llama3 rope) stopped with "cannot be checked here (...; llama.cpp reads the file): export
    again with --no-verify", and so did Phi-3, whose file llama.cpp then refused ("error loading model vocabulary").
    Now llama.cpp itself reads the file where it is installed: the llama3 file passes on its logits; a file llama.cpp
    cannot load fails the verification, with its reason; without llama.cpp, no reader is claimed."""
    pytest.importorskip("llama_cpp", reason="pip install llama-cpp-python (it compiles llama.cpp)")
    from transformers import AutoTokenizer

    from cpu_grpo.export import readback
    from tests.conftest import REWARD
    from tests.export.test_gguf_arch import _model

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rope = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    model = _model("llama", tok, rope_parameters=rope) if kind == "llama3-rope" else _model("phi3", tok)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    (tmp_path / "r.py").write_text(REWARD)
    run = _train(str(tmp_path / "model"), tmp_path / "run", tmp_path / "r.py")
    said = []
    result = export(_quiet(spec=str(run), format="gguf", quant="q8_0", out=str(tmp_path / "out"), verify_n=4),
                    log=said.append)
    check = result.checks["llama.cpp"]
    assert result.passed and check["tokens_identical"] and check["max_logit_diff_share"] < 0.1, check
    assert "Read by llama.cpp itself (llama-cpp-python)" in (tmp_path / "out" / "export.md").read_text()
    if kind == "llama3-rope":
        assert any("with llama.cpp (transformers is not asked)" in line for line in said)
    else:  # a file llama.cpp cannot load fails the check, with llama.cpp's reason
        from cpu_grpo.export import verify

        (tmp_path / "cut.gguf").write_bytes((tmp_path / "out" / next((tmp_path / "out").glob("*.gguf")).name)
                                            .read_bytes()[:4096])
        cut = verify.llama_cpp_check(model, tok, tmp_path / "cut.gguf", ["What is 1 + 1?"], ("", ""), "q8_0")
        assert not cut["passed"] and cut["error"].startswith("llama.cpp cannot load the file ("), cut
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(readback, "has_llama_cpp", lambda: False)
    try:
        if kind == "llama3-rope":
            with pytest.raises(UserError, match=r"cannot be checked here \(.*rope_parameters.*\), and llama.cpp is "
                                                r"not installed to read it"):
                export(_quiet(spec=str(run), format="gguf", quant="q8_0", out=str(tmp_path / "again")),
                       log=lambda *a: None)
    finally:
        monkeypatch.undo()


class _CrashingLlamaCpp:
    """Stands in for engine.llamacpp.LlamaCpp in its child process: loads, then dies by SIGSEGV on the first read,
    as llama.cpp's AMX path did on the Intel build machine (ggml_backend_amx_mul_mat)."""

    def __init__(self, *args):
        pass

    def tokenize(self, text: str) -> list[int]:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)


def test_a_crash_in_llama_cpp_keeps_the_file_marked_unchecked(runs, tmp_path, monkeypatch, capsys):
    """llama.cpp runs in a child process: when it dies by a signal the export is still written where asked, export.md
    says it is unchecked, no partial folder is left, and the command ends in one sentence with exit code 3."""
    from cpu_grpo.cli import main
    from cpu_grpo.engine import llamacpp
    from cpu_grpo.engine.isolated import Isolated
    from cpu_grpo.export import readback

    monkeypatch.setattr(readback, "has_llama_cpp", lambda: True)
    monkeypatch.setattr(llamacpp, "isolated", lambda *args: Isolated("llama.cpp", _CrashingLlamaCpp, *args))
    out = tmp_path / "exports" / "q8"
    assert main(["export", str(runs["full"]), "--format", "gguf", "--quant", "q8_0", "--out", str(out)]) == 3
    said = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar
    assert said.startswith("cpu-grpo: llama.cpp crashed (SIGSEGV) while reading the file back, so the export is "
                           f"unchecked: the file is kept at {out}"), said
    assert len(list(out.glob("*.gguf"))) == 1 and "UNCHECKED" in (out / "export.md").read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["q8"]  # no hidden .partial folder
