"""One rank of the data-parallel tests (tests/train/test_distributed.py), started by torchrun, or alone as one process.

    dist_worker.py grads MODEL OUT    the update's gradient on fixed completions, for each loss type
    dist_worker.py train OUT JSON     train.loop.train() with these config fields; then this rank's weights' digest
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from cpu_grpo import config
from cpu_grpo.data import example
from cpu_grpo.train import distributed, runstate, update
from cpu_grpo.train import loop as train_mod
from cpu_grpo.train.grpo import group_advantages
from cpu_grpo.train.rollout import Rollout


def grads(model: str, out: Path) -> None:
    world = distributed.init(60)
    b, g = 6, 4  # 6 prompts: 3 a rank with 2 ranks; the groups' lengths differ
    gen = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, 300, (n,), generator=gen).tolist()

    prompts = [tokens(int(n)) for n in torch.randint(4, 9, (b,), generator=gen)]
    completions = [tokens(int(n)) for n in torch.randint(1, 10, (b * g,), generator=gen)]
    rewards = torch.rand(b * g, generator=gen)
    rewards[g:2 * g] = 0.5  # one all-equal group: skipped on its rank
    batch = [example.Example(f"question {i}", "1", "basic", id=f"q{i}") for i in range(b)]
    rollout = Rollout(batch, prompts, completions, [""] * (b * g), [False] * (b * g))
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        cfg = config.build(None, None, dict(model=model, loss_type=loss_type, learning_rate=1e-30, max_grad_norm=0,
                                            num_generations=g, prompts_per_step=b, max_new_tokens=9, bf16=False,
                                            micro_batch_size=g, eval_size=0, train_size=10))
        torch.manual_seed(0)
        r, _, _ = runstate.build_run(cfg, out, None, lambda *a: None, world)
        adv, _ = group_advantages(rewards, g, cfg.scale_rewards)
        learner = update.Learner.of(r)
        batch = update.prepare(learner, None, rollout, adv, cfg.max_new_tokens)
        upd = update.summed(learner, batch, [update.backward(learner, batch)])
        if world.main:
            torch.save({"grads": {n: p.grad.clone() for n, p in r.model.named_parameters()}, "loss": upd.sums["loss"],
                        "groups": upd.groups}, out / f"grads-{loss_type}-{world.size}.pt")
    distributed.close()  # gloo's threads left to the interpreter's exit abort the process (CI, 2026-11-27)


def train(out: Path, fields: dict) -> None:
    runs = []
    build = runstate.build_run

    def keep(*args, **kwargs):
        built = build(*args, **kwargs)  # (run, reference, progress)
        runs.append(built[0])
        return built

    train_mod.build_run = keep
    resume = fields.pop("resume", False)
    (out / f"pid-{os.environ.get('RANK', '0')}").write_text(str(os.getpid()))
    try:
        train_mod.train(config.build(None, None, fields), resume=resume, log=print)
    except Exception as e:
        print(f"cpu-grpo: {e}", file=sys.stderr)
        sys.exit(2)
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    print(f"backend {backend}", flush=True)  # one write: both ranks print to one pipe, unbuffered (they interleaved)
    digest = hashlib.sha256()
    for _, p in sorted(runs[0].model.named_parameters()):
        digest.update(p.detach().float().numpy().tobytes())
    (out / f"digest-{runs[0].world.rank}-of-{runs[0].world.size}").write_text(digest.hexdigest())
    distributed.close()
    left = [n for n in _thread_names() if "gloo" in n]  # torn down with the interpreter, they abort the process
    if left:
        sys.exit(f"gloo's threads outlived destroy_process_group: {left}")


def _thread_names() -> list[str]:
    tasks = Path("/proc/self/task")
    return [(t / "comm").read_text().strip() for t in tasks.iterdir()] if tasks.is_dir() else []


if __name__ == "__main__":
    if os.environ.get("PRETEND_CUDA"):  # a CPU-only build told that CUDA is there: the run must not go to nccl
        torch.cuda.is_available = lambda: True
    mode, *rest = sys.argv[1:]
    if mode == "grads":
        grads(rest[0], Path(rest[1]))
    else:
        train(Path(rest[0]), json.loads(rest[1]))
