"""Fixtures: a tiny random Llama model with a real (trained here) byte-level BPE tokenizer; no network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_model(path: Path, arch: str = "llama", vocab_size: int = 320, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from cpu_grpo.data.tasks import generate

    corpus = [ex.question + "\n" + ex.solution for lvl in ("basic", "intermediate") for ex in generate(lvl, 200)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                  tie_word_embeddings=False, initializer_range=0.2)
    model = (LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama" else Qwen2ForCausalLM(Qwen2Config(**common)))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Tests never touch the user's cache and never wait for the hub."""
    monkeypatch.setenv("CPU_GRPO_CACHE", os.environ.get("CPU_GRPO_TEST_CACHE", str(tmp_path / "cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


REWARD = '''
def length_reward(completions, **kwargs):
    """A reward with variance inside every group, so a random model gets a gradient."""
    return [len(c) / 10 for c in completions]
'''


@pytest.fixture
def reward_file(tmp_path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARD)
    return path
