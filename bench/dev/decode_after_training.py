"""Is decoding slower after training steps in the same process? A real `cpu-grpo train` run with a probe before
each evaluation: 50 prompts decoded greedily to exactly 128 tokens (no stop tokens, so the same work whatever the
weights), twice, and 200 bf16 matmuls of a decode shape (50 x 896 by 4864 x 896).

    .venv/bin/python bench/dev/decode_after_training.py train --stages intermediate:4 --eval-size 50 \\
        --output-dir /tmp/probe --save-every 100

The first probe runs before training (the base model's evaluation), the second after the last stage. Run it alone.
"""

import sys
import time

import torch

from cpu_grpo import cli, evaluate
from cpu_grpo.rollout import Sampling, encode_prompts

run_eval = evaluate.run_eval


def probed(sampler, tok, examples, instruction, sampling, *args, **kwargs):
    prompts = encode_prompts(tok, [ex.question for ex in examples[:50]], instruction)
    fixed = Sampling(128, (), tok.pad_token_id, 0.0)
    for rep in range(2):
        t = time.time()
        sampler.generate(prompts, 1, fixed)
        print(f"PROBE decode {rep}: {time.time() - t:.1f} s for 50 x 128 tokens", flush=True)
    x, w = torch.randn(50, 896, dtype=torch.bfloat16), torch.randn(4864, 896, dtype=torch.bfloat16)
    t = time.time()
    for _ in range(200):
        torch.nn.functional.linear(x, w)
    print(f"PROBE matmul: {time.time() - t:.3f} s", flush=True)
    return run_eval(sampler, tok, examples, instruction, sampling, *args, **kwargs)


evaluate.run_eval = probed
sys.exit(cli.main(sys.argv[1:]))
