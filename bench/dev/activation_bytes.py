"""Bytes the training forward keeps for the backward, per completion row, on random models of real shapes.

    .venv/bin/python bench/dev/activation_bytes.py

Net memory allocated by one forward of group_logprobs (the torch profiler's allocation tracking: what is still
alive when the forward returns, i.e. saved activations and the output), for 2 and 4 rows of one group; the
difference over 2 rows is the cost of a row. Printed against the same difference of batching.activation_bytes, the estimate
auto_micro_rows sizes micro-batches with.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from cpu_grpo.batching import activation_bytes, group_logprobs
from cpu_grpo.models import set_threads

SHAPES = {  # name: (config class, model class, fields)
    "smollm2-135m": (LlamaConfig, LlamaForCausalLM, dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)),
    "qwen2.5-0.5b": (Qwen2Config, Qwen2ForCausalLM, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)),
}


def forward_bytes(model, prompt_len: int, completion_len: int, rows: int) -> int:
    prompts = [list(range(10, 10 + prompt_len))]
    comps = [list(range(20, 20 + completion_len)) for _ in range(rows)]
    with torch.profiler.profile(profile_memory=True) as prof:
        lp, _ = group_logprobs(model, prompts, comps, [0], rows, 0, 1.0, autocast=True)
    del lp
    return sum(e.self_cpu_memory_usage for e in prof.key_averages())


def main() -> None:
    set_threads()
    print("| shape | prompt + completion tokens | measured MB a row | estimate MB a row |")
    print("|---|---|---:|---:|")
    for name, (config_cls, model_cls, fields) in SHAPES.items():
        torch.manual_seed(0)
        model = model_cls(config_cls(**fields, tie_word_embeddings=True, max_position_embeddings=2048))
        model.train()
        for p, t in ((80, 128), (80, 256)):
            per_row = (forward_bytes(model, p, t, 4) - forward_bytes(model, p, t, 2)) / 2
            print(f"| {name} | {p} + {t} | {per_row / 2**20:.1f} | "
                  f"{(activation_bytes(model.config, p, t, 4) - activation_bytes(model.config, p, t, 2)) / 2 / 2**20:.1f} |", flush=True)
        del model


if __name__ == "__main__":
    main()
