"""Do our sampler and `transformers.generate` draw completions of the same lengths? The vs_trl prompts (the first
12 in our training order), 16 samples each, temperature 1, at most 128 new tokens; HF in fp32 under bf16 autocast
as TRL's fast setup runs it. Prints the mean length per prompt for both and a paired t statistic."""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vs_trl import problems_in_our_order  # noqa: E402

from cpu_grpo.config import TrainConfig  # noqa: E402
from cpu_grpo.models import keep_freed_memory, load_model, set_threads  # noqa: E402
from cpu_grpo.rollout import Sampler, Sampling, encode_prompts, stop_ids  # noqa: E402

set_threads()
keep_freed_memory()
model, tok = load_model("smollm2-135m", log=lambda *a: None)
prompts = encode_prompts(tok, [p.question for p in problems_in_our_order(64)[:12]], TrainConfig().instruction)
stops, pad, n, new = stop_ids(tok, model), tok.pad_token_id, 16, 128
sampler = Sampler(model)
ours = [
    [len(c) for c in sampler.generate([p], n, Sampling(new, stops, pad), torch.Generator().manual_seed(100 + i))]
    for i, p in enumerate(prompts)
]
torch.manual_seed(0)
hf = []
for p in prompts:
    ids = torch.tensor([p] * n)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=new, pad_token_id=pad)
    hf.append([next((j + 1 for j, t in enumerate(row) if t in stops), len(row)) for row in out[:, len(p):].tolist()])
for name, lens in (("ours", ours), ("transformers.generate", hf)):
    flat = sum(lens, [])
    print(f"{name}: mean {statistics.mean(flat):.1f} tokens, {sum(x >= new for x in flat) / len(flat):.0%} at the "
          f"limit; per prompt {[round(statistics.mean(x), 1) for x in lens]}")
d = [statistics.mean(a) - statistics.mean(b) for a, b in zip(ours, hf)]
print(f"paired over prompts: mean difference {statistics.mean(d):+.1f} tokens, "
      f"t = {statistics.mean(d) / (statistics.stdev(d) / len(d) ** 0.5):.2f} ({len(d) - 1} df)")
