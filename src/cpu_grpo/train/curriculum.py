"""Curriculum stages: their data, held-out and validation sets, and prioritised sampling by problem type. The
Fisher information and EWC that anchor a stage's weights are in ewc.py; the stage's run (entering it, its end) in
stages.py."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..config import TrainConfig
from ..config.stages import Stage, eval_limits
from ..data import example, loaders


def load(cfg: TrainConfig, spec: str, n: int, seed: int, split: str) -> list[example.Example]:
    return loaders.load_task(spec, n=n, seed=seed, split=split, on_error="skip" if cfg.skip_bad_lines else "raise",
                             fmt=loaders.RowFormat.parse(cfg.prompt_column, cfg.column_map))


@dataclass(frozen=True)
class HeldOut:
    """One held-out set and the completion limit it is evaluated with, before training and after each stage."""

    task: str
    examples: list[example.Example]
    max_new_tokens: int


class TypePriority:
    """Kimi k1.5's prioritised sampling (Kimi Team, 2025), by problem type: a stage's problems are drawn type
    first, each type in proportion to its failure rate in the stage's rollouts so far, max(1 - p, FLOOR) with p =
    (right + 1) / (samples + 2), then a problem of that type at random. A type the model always gets right is still
    drawn at FLOOR's rate; before any rollout every type weighs the same. The draw at a data position is a function
    of the seed, the position and the counts, so every rank draws the same problems and a resumed run the same."""

    FLOOR = 0.2

    def __init__(self, data: list[example.Example], order: list[int], seed: int):
        self.data, self.seed = data, seed
        self.by_type: dict[str, list[int]] = {}
        for i in order:
            self.by_type.setdefault(data[i].template, []).append(i)

    def weight(self, counts: dict[str, list[int]], template: str) -> float:
        samples, right = counts.get(template, (0, 0))
        return max(1 - (right + 1) / (samples + 2), self.FLOOR)

    def draw(self, pos: int, n: int, counts: dict[str, list[int]]) -> list[example.Example]:
        rng = random.Random(f"{self.seed}:{pos}")
        types = list(self.by_type)
        picked = rng.choices(types, [self.weight(counts, t) for t in types], k=n)
        return [self.data[self.by_type[t][rng.randrange(len(self.by_type[t]))]] for t in picked]

    @staticmethod
    def count(counts: dict[str, list[int]], batch: list[example.Example], first_reward: list[float]) -> dict:
        """`counts` (template -> [samples, right]) with a step's groups added, as a new dict; right: the first reward
        is above 0."""
        g, out = len(first_reward) // len(batch), {t: list(c) for t, c in counts.items()}
        for i, ex in enumerate(batch):
            rewards = first_reward[i * g:(i + 1) * g]
            c = out.setdefault(ex.template, [0, 0])
            c[0] += g
            c[1] += sum(1 for x in rewards if x == x and x > 0)  # NaN (no answer to score) is not right
        return out


def held_out(cfg: TrainConfig) -> list[HeldOut]:
    """The evaluation sets (each stage's task, then eval_task's entries, at their limits: config.stages.eval_limits):
    eval_size problems from the test split of each (seed + 1), never trained on."""
    if cfg.eval_size == 0:
        return []
    return [HeldOut(task, load(cfg, task, cfg.eval_size, cfg.seed + 1, "test"), limit)
            for task, limit in eval_limits(cfg).items()]


def validation(cfg: TrainConfig, stage: Stage) -> list[example.Example]:
    """Problems for promotion checks: the ones right after the held-out set in the same sequence (disjoint)."""
    n = cfg.eval_size + cfg.promote_size
    return load(cfg, stage.task, n, cfg.seed + 1, "test")[cfg.eval_size:]
