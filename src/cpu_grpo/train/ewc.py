"""Elastic Weight Consolidation and the diagonal Fisher information it weighs the weights by.

EWC (Kirkpatrick et al., 2017) adds `lambda/2 * sum_k sum_i F_k,i (theta_i - theta*_k,i)^2` over earlier
stages k. The sum over stages is kept in closed form: sum_k F_k (theta - a_k)^2 equals
F (theta - a)^2 + C with F = sum_k F_k and a = sum_k F_k a_k / F, so two tensors per parameter hold any
number of stages and the gradient is exact. Each stage's Fisher is normalised to mean 1 over the trainable
parameters, so lambda is in units of "one average parameter": without that, raw Fisher values of a
135M-parameter model are ~1e-8 and a useful lambda would depend on the model size.
With `ewc_decoupled` the penalty is not a gradient but a pull of the weights towards the anchor after each
optimizer step (EWC.pull), since Adam cancels a gradient penalty's strength.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

EWC_FILE = "ewc.safetensors"


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def fisher_diagonal(model, seq_logprob, n: int, mine: int | None = None, add_up=None) -> dict[str, torch.Tensor]:
    """Mean squared gradient of log p(completion | prompt) over n samples, normalised to mean 1.

    `seq_logprob(i)` returns the summed log-prob (a scalar with grad) of sample i; the samples should come
    from the policy itself (then this is the Fisher, not the empirical Fisher of fixed data). Shared among
    processes: each runs `mine` of the n samples and `add_up(tensors)` sums the tensors over them in place.
    """
    params = trainable(model)
    acc = {k: torch.zeros_like(p, dtype=torch.float32) for k, p in params.items()}
    for i in range(n if mine is None else mine):
        model.zero_grad(set_to_none=True)
        seq_logprob(i).backward()
        for k, p in params.items():
            if p.grad is not None:
                acc[k] += p.grad.float() ** 2
    model.zero_grad(set_to_none=True)
    if add_up is not None:
        add_up(list(acc.values()))
    mean = sum(v.sum().item() for v in acc.values()) / max(1, sum(v.numel() for v in acc.values())) / n
    scale = 1.0 / (n * mean) if mean > 0 else 0.0
    return {k: v.mul_(scale) for k, v in acc.items()}


@dataclass
class EWC:
    """Accumulated Fisher F, Fisher-weighted anchor a and constant C of the earlier stages."""

    fisher: dict[str, torch.Tensor] = field(default_factory=dict)
    anchor: dict[str, torch.Tensor] = field(default_factory=dict)
    const: float = 0.0
    stages: list[str] = field(default_factory=list)

    def add_stage(self, name: str, fisher: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> None:
        for k, f_new in fisher.items():
            theta = params[k].detach().float()
            if k not in self.fisher:
                self.fisher[k], self.anchor[k] = f_new.clone(), theta.clone()
                continue
            f_old, a_old = self.fisher[k], self.anchor[k]
            f = f_old + f_new
            a = torch.where(f > 0, (f_old * a_old + f_new * theta) / f.clamp(min=1e-30), theta)
            self.const += ((f_old * a_old ** 2).sum() + (f_new * theta ** 2).sum() - (f * a ** 2).sum()).item()
            self.fisher[k], self.anchor[k] = f, a
        self.stages.append(name)

    def apply(self, model, lam: float, grad: bool = True) -> tuple[float, float]:
        """Add lam * F * (theta - a) to each trainable parameter's .grad (unless not `grad`); return the penalty
        lam/2 * (sum F (theta-a)^2 + C) and the norm of lam * F * (theta - a), EWC's gradient, to set beside the
        policy's (logged as `ewc_grad_norm`: on a LoRA adapter it reached 6-20 times the policy's, curriculum.md)."""
        if not self.fisher or lam == 0:
            return 0.0, 0.0
        total, squares = self.const, 0.0
        with torch.no_grad():
            for k, p in trainable(model).items():
                if k not in self.fisher:
                    continue
                diff = p.detach().float() - self.anchor[k]
                weighted = self.fisher[k] * diff
                total += (weighted * diff).sum().item()
                squares += (weighted * weighted).sum().item()
                if grad:
                    g = (lam * weighted).to(p.dtype)
                    p.grad = g if p.grad is None else p.grad.add_(g)
        return 0.5 * lam * total, lam * math.sqrt(squares)

    def pull(self, model, lam: float, lr: float) -> None:
        """Decoupled EWC, after an optimizer step: theta -= min(1, lr * lam * F) * (theta - a).

        Through the gradient, once lam * F * (theta - a) dominates the gradient's norm, clipping divides lam out
        again and Adam scales each weight's step by its own gradient size: lambda 100, 1,000 and 10,000 gave the
        same trajectory in docs/curriculum.md's forgetting case (the L2 penalty that AdamW's decoupled weight
        decay replaced; Loshchilov and Hutter, 2019). Applied to the weights, its strength is what lam says."""
        if not self.fisher or lam == 0:
            return
        with torch.no_grad():
            for k, p in trainable(model).items():
                if k in self.fisher:
                    rate = (lr * lam * self.fisher[k]).clamp_(max=1.0)
                    p.sub_((rate * (p.float() - self.anchor[k])).to(p.dtype))

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        tensors = {f"fisher.{k}": v.contiguous() for k, v in self.fisher.items()}
        tensors |= {f"anchor.{k}": v.contiguous() for k, v in self.anchor.items()}
        save_file(tensors, str(path), metadata={"const": repr(self.const), "stages": json.dumps(self.stages)})

    @classmethod
    def load(cls, path: Path) -> EWC:
        from safetensors import safe_open

        out = cls()
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata()
            for key in f.keys():
                kind, name = key.split(".", 1)
                (out.fisher if kind == "fisher" else out.anchor)[name] = f.get_tensor(key)
        out.const, out.stages = float(meta["const"]), json.loads(meta["stages"])
        return out
