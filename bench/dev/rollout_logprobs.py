"""Could the sampler's log-probs serve as GRPO's "old" log-probs? Sampler (bf16 copy, KV cache) against the
training forward (fp32 masters under bf16 autocast), on the same sampled tokens.

.venv/bin/python bench/dev/rollout_logprobs.py   (SmolLM2-135M, 4 prompts x 8 samples x 128 tokens, 2 rollouts)
"""

import torch

from cpu_grpo import rollout, tasks
from cpu_grpo.batching import group_logprobs
from cpu_grpo.config import TrainConfig
from cpu_grpo.llama import PrefixCache, cached_forward, decode_step
from cpu_grpo.models import keep_freed_memory, load_model, set_threads

set_threads()
keep_freed_memory()
model, tok = load_model("smollm2-135m", log=lambda *a: None)
sampler = rollout.Sampler(model)
eos = rollout.stop_ids(tok, model)


@torch.no_grad()
def sample_with_logprobs(prompts, g, max_new, gen):
    """rollout._fast_generate, also returning log p(token) under the sampler (temperature 1, no top-k/p)."""
    net, projs = sampler.net, sampler.projs
    cfg = net.config
    b = len(prompts)
    ids, valid = rollout.left_pad(prompts, tok.pad_token_id)
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    hd = cfg.hidden_size // cfg.num_attention_heads
    pc = [(torch.zeros(b, cfg.num_key_value_heads, hd, ids.shape[1], dtype=net.dtype),
           torch.zeros(b, cfg.num_key_value_heads, ids.shape[1], hd, dtype=net.dtype)) for _ in net.model.layers]
    last = cached_forward(net, projs, ids, pos, pc, 0, valid)
    cache = PrefixCache(pc, valid, g, max_new)
    next_pos = pos[:, -1].repeat_interleave(g, 0) + 1
    logits = net.lm_head(last).repeat_interleave(g, 0)
    out, lps = [[] for _ in range(b * g)], [[] for _ in range(b * g)]
    done = torch.zeros(b * g, dtype=torch.bool)
    for step in range(max_new):
        t = rollout.sample_token(logits, 1.0, 0, 1.0, gen)
        lp = logits.float().log_softmax(-1).gather(-1, t[:, None]).squeeze(-1)
        for r, tt, ll, d in zip(cache.rows.tolist(), t.tolist(), lp.tolist(), done.tolist(), strict=True):
            if not d:
                out[r].append(tt)
                lps[r].append(ll)
        done = done | torch.isin(t, torch.tensor(eos))
        if step == max_new - 1 or bool(done.all()):
            break
        keep = (~done).nonzero().squeeze(-1)
        cache.keep(keep)
        t, next_pos, done = t[keep], next_pos[keep], done[keep]
        logits = net.lm_head(decode_step(net, projs, cache, t, next_pos, step))
        next_pos = next_pos + 1
    return out, lps


probs = tasks.generate("basic", 8, seed=3)
diffs = []
for k in range(2):
    prompts = rollout.encode_prompts(tok, [p.question for p in probs[4 * k:4 * k + 4]], TrainConfig().instruction)
    comps, lps = sample_with_logprobs(prompts, 8, 128, torch.Generator().manual_seed(k))
    with torch.no_grad():
        for i in range(4):
            lp, mask = group_logprobs(model, prompts, comps, [i], 8, tok.pad_token_id, 1.0, autocast=True)
            for j in range(8):
                n = len(comps[i * 8 + j])
                diffs.append(lp[j, :n] - torch.tensor(lps[i * 8 + j]))
d = torch.cat(diffs)  # training minus sampler, per token
ratio = d.exp()
print(f"{len(d)} tokens; log-prob difference (training - sampler): mean {d.mean():+.4f}, mean |d| {d.abs().mean():.4f}, "
      f"p99 |d| {d.abs().quantile(0.99):.4f}, max |d| {d.abs().max():.3f}")
print(f"ratio exp(d): outside [0.8, 1.2] (the clip range) {100 * ((ratio < 0.8) | (ratio > 1.2)).float().mean():.2f}% "
      f"of tokens, outside [0.99, 1.01] {100 * ((ratio < 0.99) | (ratio > 1.01)).float().mean():.1f}%")
seq = torch.stack([x.sum() for x in diffs])
print(f"per sequence, sum of d: mean {seq.mean():+.3f}, mean |.| {seq.abs().mean():.3f}, max |.| {seq.abs().max():.3f}")
