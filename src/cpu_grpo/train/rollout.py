"""A step's samples and their rewards, as records: `Rollout` (B problems, their prompts and G completions each) made
by `sample`, `Scored` (the weighted total and each reward function's values) made by `score`, each rank's groups
`gathered` back in the step's order, and whether each sample is `correct` as the evaluations judge it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import TrainConfig
from ..data import example, rewards
from ..data.environments import Environments, episodes
from ..engine import agent
from ..engine.agent import Turns
from ..engine.progress import ProgressLines
from ..engine.prompts import encode_prompts
from ..eval.evaluate import Judge
from .distributed import World


@dataclass
class Rollout:
    """One step's samples: B problems, their prompts and G completions each, group-major (row i*G+j)."""

    batch: list[example.Example]
    prompts: list[list[int]]
    completions: list[list[int]]
    texts: list[str]
    truncated: list[bool]  # cut at the length limit before the model ended it
    turns: list[Turns] | None = None  # with tools: each row's messages, calls and which tokens the model wrote
    envs: list | None = None  # with environments: each row's instance, its episode played (rewards read it)
    sampler_logps: list[list[float]] | None = None  # each token's log-prob under the sampler (int8: issue 70)

    @property
    def group_size(self) -> int:
        """Completions a problem (0 for no problems)."""
        return len(self.completions) // len(self.batch) if self.batch else 0

    def groups(self, idx: list[int], g: int, samples: list[list[int]] | None = None) -> Rollout:
        """The groups `idx` (in that order) as a rollout of their own; of each, the `samples` given (all g by
        default, the same number for every group)."""
        rows = [i * g + j for n, i in enumerate(idx) for j in (samples[n] if samples else range(g))]
        return Rollout([self.batch[i] for i in idx], [self.prompts[i] for i in idx], _rows(self.completions, rows),
                       _rows(self.texts, rows), _rows(self.truncated, rows), _rows(self.turns, rows),
                       _rows(self.envs, rows), _rows(self.sampler_logps, rows))

    def __add__(self, other: Rollout) -> Rollout:
        return Rollout(self.batch + other.batch, self.prompts + other.prompts, self.completions + other.completions,
                       self.texts + other.texts, self.truncated + other.truncated, _join(self.turns, other.turns),
                       _join(self.envs, other.envs), _join(self.sampler_logps, other.sampler_logps))

    def for_rewards(self) -> list:
        """The completions as reward functions get them (TRL's way): the text for a text prompt, the assistant
        message for a chat prompt, and with tools the whole exchange (assistant, tool, ..., assistant)."""
        if self.turns is not None:
            return [t.messages for t in self.turns]
        return rewards.as_completions(self.texts, self.batch, self.group_size)


def _rows(xs: list | None, rows: list[int]) -> list | None:
    return None if xs is None else [xs[k] for k in rows]


def _join(a: list | None, b: list | None) -> list | None:
    return None if a is None or b is None else a + b


@dataclass
class Scored:
    """A rollout's rewards, row for row: the weighted total (N,) and each reward function's values (N each; None
    or nan where a function scored nothing)."""

    total: torch.Tensor
    per_fn: dict[str, list[float]]

    def groups(self, idx: list[int], g: int) -> Scored:
        """The rewards of the groups `idx` (in that order)."""
        rows = [i * g + j for i in idx for j in range(g)]
        return Scored(self.total[rows], {k: [v[r] for r in rows] for k, v in self.per_fn.items()})

    def __add__(self, other: Scored) -> Scored:
        return Scored(torch.cat([self.total, other.total]),
                      {k: v + other.per_fn[k] for k, v in self.per_fn.items()})

    @property
    def first(self) -> list[float]:
        """The first reward function's values (correctness by default: what dynamic sampling reads)."""
        return next(iter(self.per_fn.values()))


def sample(cfg: TrainConfig, tok, sampler, sampling, gen: torch.Generator, batch: list[example.Example], log=print,
           what: str = "", tools: list = (), environments: Environments | None = None) -> Rollout:
    """G completions for each problem of the batch as `sampling` says (its limit, temperature, stop tokens), from
    the sampler with the run's generator; with `tools` or `environments`, G conversations that may call them
    (engine/agent.py; each with an environment of its own, reset for its row) within the same limit. A rollout that
    takes long says how far it is, as `what` (engine.progress.ProgressLines)."""
    if what:
        sampling = dataclasses.replace(sampling, progress=ProgressLines(log, what))
    g, limit, stops, turns, envs = cfg.num_generations, sampling.max_new_tokens, sampling.stops, None, None
    chats = [ex.chat(cfg.instruction, cfg.system_prompt) for ex in batch]
    if tools or environments:
        started = episodes(environments, batch, chats, g, tools)
        prompts, turns = agent.sample_with_tools(tok, agent.generating(sampler, sampling, gen), started.chats, g,
                                                 started.tools, limit, cfg.max_tool_calling_iterations, stops)
        completions, envs = [t.ids for t in turns], started.envs or None
    else:
        prompts = encode_prompts(tok, chats)
        completions = sampler.generate(prompts, g, sampling, gen)
    completions, logps = completions if sampling.logprobs else (completions, None)
    truncated = [len(c) >= limit and c[-1] not in stops for c in completions]
    return Rollout(batch, prompts, completions, tok.batch_decode(completions, skip_special_tokens=True), truncated,
                   turns, envs, logps)


def score(cfg: TrainConfig, reward_fns, rollout: Rollout, log=print, stop=None) -> Scored:
    """Every reward function on the completions: the weighted total and each function's values. Each call may
    take `reward_timeout` seconds (then it scores 0); `stop()` turning true interrupts it (rewards.RewardStopped).

    A completion cut at the length limit earns no credit (its positive rewards count as 0; penalties such as
    `overlong` stay) unless `score_truncated`: otherwise a model can write its answer and then anything until the
    limit (`#### 70` and bare `####` lines) and be paid for it.
    """
    g, batch = cfg.num_generations, rollout.batch
    columns = {**rewards.reward_columns(batch, g), "completion_ids": rollout.completions,
               **({"environments": rollout.envs} if rollout.envs else {})}
    ids = [ex.id for ex in batch for _ in range(g)]
    completions = rollout.for_rewards()
    per_fn = {}
    for fn in reward_fns:
        values = rewards.call_reward(fn, completions, columns, ids, log, cfg.reward_timeout, stop)
        per_fn[fn.__name__] = [min(v, 0.0) if cut and not cfg.score_truncated else v
                               for v, cut in zip(values, rollout.truncated, strict=True)]
    total = torch.zeros(len(rollout.texts))
    for w, values in zip(cfg.reward_weights, per_fn.values(), strict=True):
        total += w * torch.tensor(values).nan_to_num(0.0)
    return Scored(total, per_fn)


def gathered(world: World, rollout: Rollout, scored: Scored) -> tuple[Rollout, Scored]:
    """Every rank's groups back in the step's prompt order (one process: as they are)."""
    if world.size == 1:
        return rollout, scored
    g, rollout = rollout.group_size, dataclasses.replace(rollout, envs=None)  # scored already; they stay here
    whole = world.interleave([(rollout.groups([i], g), scored.groups([i], g)) for i in range(len(rollout.batch))])
    return sum((x[0] for x in whole[1:]), whole[0][0]), sum((x[1] for x in whole[1:]), whole[0][1])


def correct(cfg: TrainConfig, rollout: Rollout, scored: Scored) -> list[bool]:
    """Whether each sampled completion is correct as the evaluations judge it (eval.evaluate.Judge's rule: a math
    row by its extracted answer unless `correct_reward` is set, any other row by the correct reward, `correct_reward`
    or else the first, scoring 1), from the values the step's scoring gave (a completion cut at the limit has 0)."""
    judged = list(scored.per_fn.values())[cfg.rewards.index(cfg.correct_reward) if cfg.correct_reward else 0]
    rows = [ex for ex in rollout.batch for _ in range(rollout.group_size)]
    return Judge(everywhere=bool(cfg.correct_reward)).verdicts(rows, rollout.for_rewards(), judged)
