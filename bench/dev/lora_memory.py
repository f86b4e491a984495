"""RSS after each phase of building a LoRA run on a 0.5B model: where the peak comes from.

.venv/bin/python bench/dev/lora_memory.py MODEL_DIR_OR_GGUF
"""

import sys

import torch
from common import rss

from cpu_grpo.config import TrainConfig
from cpu_grpo.models import keep_freed_memory, set_threads
from cpu_grpo.rollout import Sampler, Sampling, encode_prompts
from cpu_grpo.runstate import prepare_model

set_threads()
keep_freed_memory()


rss("start")
cfg = TrainConfig(model=sys.argv[1], use_lora=True)
model, tok = prepare_model(cfg, log=lambda *a: None)
rss("model (LoRA, base in bf16)")
sampler = Sampler(model)
rss("sampler")
prompts = encode_prompts(tok, ["What is 2 + 3?"] * 4)
sampler.generate(prompts, 4, Sampling(32, (), tok.pad_token_id), torch.Generator().manual_seed(0))
rss("rollout 4 x 4 x 32")
sampler.release()
rss("released")
sampler.refresh()
rss("refreshed")
