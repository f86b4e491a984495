import copy
import warnings

import torch

warnings.filterwarnings("ignore")
from transformers import AutoModelForCausalLM, AutoTokenizer

from cpu_grpo.models import resolve_model

torch.set_num_threads(2)
path = resolve_model("smollm2-135m")
tok = AutoTokenizer.from_pretrained(path)
ref = AutoModelForCausalLM.from_pretrained(path).float().eval()


class Q(torch.nn.Module):
    def __init__(s, lin, rr):
        super().__init__()
        s.rr = rr
        w = lin.weight.detach().float()
        sc = (w.abs().amax(1).clamp(min=1e-8) / 127).double()
        q = torch.quantize_per_channel(w, sc, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        s.p = torch.ops.quantized.linear_prepack(q, None)

    def forward(s, x):
        return torch.ops.quantized.linear_dynamic(x, s.p, s.rr)


def quant(m, rr):
    m = copy.deepcopy(m)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, torch.nn.Linear):
            parent, _, child = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, child, Q(mod, rr))
    return m


text = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May? Let's think step by step. In April she sold 48 clips. In May she sold 48 / 2 = 24 clips. Altogether 48 + 24 = 72 clips. The answer is 72."
ids = tok([text] * 4, return_tensors="pt").input_ids
with torch.no_grad():
    lp = ref(ids).logits.log_softmax(-1)
    for name, m in [
        ("bf16", copy.deepcopy(ref).bfloat16()),
        ("int8 rr", quant(ref, True)),
        ("int8 full", quant(ref, False)),
    ]:
        l2 = m(ids).logits.float().log_softmax(-1)
        kl = (lp.exp() * (lp - l2)).sum(-1).mean()
        agree = (lp.argmax(-1) == l2.argmax(-1)).float().mean()
        print(f"{name}: KL(fp32||x) per token {kl:.4f}  argmax agree {agree:.3f}")


def quant_only(m, keys, rr=False):
    m = copy.deepcopy(m)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, torch.nn.Linear) and any(k in name for k in keys):
            parent, _, child = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, child, Q(mod, rr))
    return m


with torch.no_grad():
    for keys in (["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"], ["lm_head"]):
        l2 = quant_only(ref, keys)(ids).logits.float().log_softmax(-1)
        kl = (lp.exp() * (lp - l2)).sum(-1).mean()
        print(keys, f"KL {kl:.4f}")
