"""Bytes the training forward keeps for the backward, per completion row, on random models of real shapes.

    .venv/bin/python bench/dev/activation_bytes.py

Net memory allocated by one forward of group_logprobs (the torch profiler's allocation tracking: what is still
alive when the forward returns, i.e. saved activations and the output; `kept_bytes` of tests/test_batching.py),
for 2 and 4 rows of one group; half the difference is the cost of a row. Printed against the same difference of
batching.activation_bytes, the estimate auto_micro_rows sizes micro-batches with.
"""

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_batching import kept_bytes  # noqa: E402

from cpu_grpo.batching import activation_bytes  # noqa: E402
from cpu_grpo.models import set_threads  # noqa: E402

SHAPES = {  # name: (config class, model class, fields)
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)),
}


def main() -> None:
    set_threads()
    print("| shape | prompt + completion tokens | measured MB a row | estimate MB a row |")
    print("|---|---|---:|---:|")
    for name, (config_cls, model_cls, fields) in SHAPES.items():
        torch.manual_seed(0)
        model = model_cls(config_cls(**fields, tie_word_embeddings=True, max_position_embeddings=2048))
        model.train()
        for p, t in ((80, 128), (80, 256)):
            measured = (kept_bytes(model, p, t, 4) - kept_bytes(model, p, t, 2)) / 2
            estimate = (activation_bytes(model.config, p, t, 4) - activation_bytes(model.config, p, t, 2)) / 2
            print(f"| {name} | {p} + {t} | {measured / 2**20:.1f} | {estimate / 2**20:.1f} |", flush=True)
        del model


if __name__ == "__main__":
    main()
