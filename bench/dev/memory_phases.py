import os

import torch
from common import rss

from cpu_grpo import tasks
from cpu_grpo.batching import group_logprobs
from cpu_grpo.config import TrainConfig
from cpu_grpo.models import keep_freed_memory, load_model, set_threads
from cpu_grpo.rollout import Sampler, Sampling, encode_prompts, stop_ids

set_threads()
if not os.environ.get("NOMALLOPT"):
    keep_freed_memory()


model, tok = load_model("smollm2-135m", log=lambda *a: None)
model.train()
rss("model")
s = Sampler(model)
rss("sampler")
opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
g = 8
probs = tasks.generate("basic", 16, seed=7)
for step in range(3):
    prompts = encode_prompts(tok, [p.question for p in probs[step * 4 : (step + 1) * 4]], TrainConfig().instruction)
    comps = s.generate(
        prompts, g, Sampling(128, stop_ids(tok, model), tok.pad_token_id), torch.Generator().manual_seed(step)
    )
    rss(f"rollout {step}")
    opt.zero_grad(set_to_none=True)
    for i in range(4):
        lp, mask = group_logprobs(model, prompts, comps, [i], g, tok.pad_token_id, 1.0, autocast=True)
        (lp * mask).sum().backward()
        rss(f"  bwd {i}")
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    s.refresh()
    rss(f"step {step}")
