"""Data-parallel GRPO on torch.distributed: one process per rank, launched by torchrun; gloo on CPU.

How a step is shared (train.py calls these):
1. Rank r samples and scores whole groups for prompts r, r+N, ... of the step, with its own generator, so
   advantages never cross ranks.
2. The groups are gathered back into prompt order (`World.interleave`): every rank then holds the whole step,
   so advantages (also with `scale_rewards: batch`), loss normalisers and metrics are those of one process.
3. Each rank back-propagates its own groups; the gradients are summed once per optimizer step
   (`World.sum_grads`; a rank with nothing to train adds zeros, so ranks never wait on each other forever),
   and every rank takes the same optimizer step from the same gradient.
4. Rank 0 alone writes the run directory (logs, metrics, groups, evaluations, checkpoints).
A rank that fails records its message in the rendezvous store before it exits; the others fail their next
collective (when the rank's connection closes, or after `ddp_timeout`) and name the rank in one sentence.
With one process (no torchrun) every method is the identity, and nothing of torch.distributed is touched.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from dataclasses import dataclass

import torch

from ..errors import UserError
from .launch import launched


class RankError(UserError):
    """Another rank failed or stopped answering; the message names it and says how to continue."""


@dataclass(eq=False)
class World:
    rank: int = 0
    size: int = 1
    local_size: int = 1  # ranks on this machine
    comm_seconds: float = 0.0  # time in collectives so far: the transfers, and waiting for slower ranks

    @property
    def main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives (identity for one process)
    def broadcast(self, obj):
        """Rank 0's value of `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        self._run(torch.distributed.broadcast_object_list, box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        self._run(torch.distributed.all_gather_object, out, obj)
        return out

    def interleave(self, items: list) -> list:
        """This rank's share of a list (items r, r+N, ... of the whole) gathered back into the whole list."""
        if self.size == 1:
            return items
        parts = self.gather(items)
        return [parts[i % self.size][i // self.size] for i in range(sum(len(p) for p in parts))]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the ranks."""
        if self.size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        self._run(torch.distributed.all_reduce, t)
        return t.tolist()

    def _run(self, collective, *args, **kwargs) -> None:
        t0 = time.perf_counter()
        try:
            collective(*args, **kwargs)
        except Exception as e:  # gloo: "Connection closed by peer", a timeout, ...
            raise CollectiveFailed(e) from e
        finally:
            self.comm_seconds += time.perf_counter() - t0

    def any(self, flag: bool) -> bool:
        return self.sum([float(flag)])[0] > 0 if self.size > 1 else flag

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the parameters' gradients over the ranks (a missing gradient counts as zeros)."""
        if self.size == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.sum_tensors([p.grad for p in params])

    def sum_tensors(self, tensors: list[torch.Tensor]) -> None:
        """Sum tensors over the ranks, in place, in one flat fp32 buffer (one collective)."""
        if self.size == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        self._run(torch.distributed.all_reduce, flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def same_params(self, model) -> None:
        """Rank 0's trainable weights on every rank (a fresh start: every rank begins from the same point)."""
        if self.size == 1:
            return
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    self._run(torch.distributed.broadcast, p.data, src=0)


SINGLE = World()  # one process: never changed, since no collective runs


PER_MACHINE = ("threads", "allocator")  # fields a machine may set for itself


def same_config(world: World, fields: dict) -> None:
    """Every rank was started with rank 0's configuration (but the PER_MACHINE fields), or RankError naming the
    first field that differs: different learning rates drift apart without a word, and different models, steps or
    LoRA end later in a collective's size mismatch."""
    if world.size == 1:
        return
    every = world.gather({k: v for k, v in fields.items() if k not in PER_MACHINE})
    for rank, theirs in enumerate(every):
        if diff := next((k for k in every[0] if every[0][k] != theirs.get(k)), None):
            raise RankError(f"rank {rank} was started with {diff} = {theirs.get(diff)!r} but rank 0 with "
                            f"{every[0][diff]!r}: start every rank with the same configuration (the same command "
                            "and config file on every machine).")


def init(timeout_s: float) -> World:
    """Join the process group that torchrun describes (env://), with a bounded timeout; SINGLE without torchrun."""
    if not launched():
        return SINGLE
    import torch.distributed as dist

    # transformers imports torch.distributed.nn.functional while loading a tokenizer; imported after the group
    # exists, its functions bind the group as a default argument, destroy_process_group cannot free it, and gloo's
    # threads are torn down with the interpreter: "terminate called without an active exception" (SIGABRT) at exit
    import torch.distributed.nn.functional  # noqa: F401

    if not dist.is_initialized():
        try:  # gloo, also where CUDA is present: the model and every tensor stay on the CPU
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as e:
            raise RankError(f"rank {os.environ.get('RANK', '?')}: could not join the other ranks at "
                            f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} ({_first_line(e)}): "
                            "check --rdzv-endpoint and that every machine reaches it (GLOO_SOCKET_IFNAME picks "
                            "the network interface)") from None
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def record_failure(world: World, e: BaseException) -> None:
    """Leave this rank's error in the rendezvous store, for the other ranks' message; never raises."""
    if world.size == 1:
        return
    try:
        _store().set(f"cpu_grpo/error/{world.rank}", f"{type(e).__name__}: {_first_line(e)}"[:300])
    except Exception:
        pass


def lost_rank_message(world: World, e: BaseException) -> str:
    """One sentence for a collective that failed: which rank failed (with its message) or stopped answering, and
    how to go on."""
    time.sleep(0.5)  # a rank that failed by itself records its error before its connection closes
    errors, answering, asked = {}, set(), []

    def ask() -> None:
        try:
            store = _store()
            store.set(f"cpu_grpo/lost/{world.rank}", "1")
            time.sleep(1.5)  # the ranks still alive fail their collective too, and say so here
            for r in range(world.size):
                if store.check([f"cpu_grpo/error/{r}"]):
                    errors[r] = store.get(f"cpu_grpo/error/{r}").decode()
                if store.check([f"cpu_grpo/lost/{r}"]):
                    answering.add(r)
            asked.append(True)
        except Exception:  # the store is gone with its machine
            pass

    # a store behind a cut link never answers (its socket waits for TCP to give up, minutes): ask in a thread
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(8.0)
    if not asked:  # torchrun keeps the store on the machine of rank 0 (the rendezvous endpoint)
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        return (f"rank {world.rank}: rank 0 and the rendezvous store at {where} stopped answering (that machine "
                f"stopped, or the network link between them is down; {_first_line(e)}); the run stopped: run the "
                "same command again with --resume once that machine and its link are back, or on the machines "
                "left with one of them as the rendezvous endpoint")
    then = "; the run stopped on every rank: run the same command again with --resume (on fewer machines too)"
    if errors:
        r, msg = next(iter(errors.items()))
        return f"rank {world.rank}: rank {r} failed ({msg}){then}"
    silent = sorted(set(range(world.size)) - answering - {world.rank})
    who = f"rank {', '.join(map(str, silent))}" if silent and len(answering) > 0 else "another rank"
    return (f"rank {world.rank}: {who} stopped answering (killed, out of memory, its network link down, or hung "
            f"past ddp_timeout; {_first_line(e)}){then}")


class CollectiveFailed(RuntimeError):
    """A collective failed because another rank is gone; train.py turns it into a RankError with a name."""

    def __init__(self, cause: BaseException):
        super().__init__(_first_line(cause))
        self.cause = cause


def _store():
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def close() -> None:
    if launched() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
