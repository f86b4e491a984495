"""Environments a model acts in, TRL's `environment_factory` (issue 69): a class, or any callable that returns an
instance, with

- `reset(**row)`: starts an episode for one rollout, from its dataset row (the keywords its signature takes, every
  column when it takes `**kwargs`); text it returns is appended to the prompt's last user message;
- public methods (typed, with a docstring): the tools of that rollout, beside the run's `tools`;
- `get_reward()`, optional: the rollout's score, read by the builtin reward `environment` (added to the run's
  rewards with weight 1 whenever an environment is given, as TRL adds it).

One instance per rollout, made once and reset for each episode (TRL's pool). One environment serves every row;
several (`--environment wordle=games.py:Wordle,maze=games.py:Maze`) are routed by the rows' `environment` column.
An environment written for TRL runs unchanged.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError
from . import tools as tool_lib

GIVEN: dict[str, Callable] = {}  # environments handed over in this process (the Python API): name -> factory


class EnvError(UserError):
    """An environment that cannot be used as given; the message says what to change."""


@contextlib.contextmanager
def given(factories: dict[str, Callable]):
    """While inside, these factories are environments by their names (a script's or a notebook's own)."""
    GIVEN.update(factories)
    try:
        yield
    finally:
        for name in factories:
            GIVEN.pop(name, None)


def load_environments(specs: Sequence[str]) -> Environments:
    """The environments `specs` name: `file.py:Class` or `module:Class` (every row's), or `name=file.py:Class` each
    (the rows' `environment` column picks one). Each is made once now and checked (a `reset`, tools that give a
    schema); that instance is the first of its pool."""
    from .rewards import RewardError, load_function

    envs = Environments({})
    for spec in specs:
        name, _, where = spec.rpartition("=")
        if not name and len(specs) > 1:
            raise EnvError(f"environment {spec!r}: with several environments, name each as name=file.py:Class; "
                           "the rows' `environment` column says which one a row uses")
        try:
            factory = GIVEN.get(where) or load_function(where, "environment")
        except RewardError as e:  # the loader's sentence, about an environment
            raise EnvError(str(e)) from None
        envs.factories[name] = factory
        envs.pools[name] = [check(name or where, factory())]
    return envs


def check(name: str, env: Any) -> Any:
    """The environment, unless it has no `reset` or a tool that gives no JSON schema (refused, naming it)."""
    if not callable(getattr(env, "reset", None)):
        raise EnvError(f"environment {name}: it has no reset method; give its class a reset(self, **kwargs) that "
                       "starts an episode (TRL's environment_factory)")
    try:
        tool_lib.schemas(methods(env))
    except tool_lib.ToolError as e:
        raise EnvError(f"environment {name}: {e}") from None
    return env


def methods(env: Any) -> list[Callable]:
    """The environment's tools: its public methods other than reset and get_reward (looked up on the class, so that
    a property is not run)."""
    return [getattr(env, n) for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if not n.startswith("_") and n not in ("reset", "get_reward")]


def route(factories: dict[str, Callable], examples: Sequence) -> list[str]:
    """The environment of each example: the only one, or the one its `environment` column names (refused when a row
    names none or one that was not given)."""
    if "" in factories:
        return [""] * len(examples)
    names = [ex.columns.get("environment") for ex in examples]
    for ex, name in zip(examples, names, strict=True):
        if name not in factories:
            raise EnvError(f"row {ex.id} has environment {name!r}, which is not one of the environments given "
                           f"({', '.join(factories)}): give each row an `environment` column naming one")
    return names


@dataclass
class Episodes:
    """Each rollout's environment, reset for its row: its prompt (the observation appended) and its tools."""

    envs: list[Any]
    chats: list[list[dict]]
    tools: list[list[Callable]]


@dataclass
class Environments:
    """The run's environments and their instances, made as rows need them and reset for each episode."""

    factories: dict[str, Callable]
    pools: dict[str, list] = field(default_factory=dict)

    def start(self, examples: Sequence, chats: Sequence[list[dict]], g: int, tools: Sequence[Callable] = ()) \
            -> Episodes:
        """`g` episodes of each example (group-major), one instance each: reset with the row's columns."""
        names = route(self.factories, examples)
        cursor: dict[str, int] = {}
        envs, row_chats = [], []
        for ex, chat, name in zip(examples, chats, names, strict=True):
            for _ in range(g):
                pool = self.pools.setdefault(name, [])
                i = cursor[name] = cursor.get(name, -1) + 1
                if i == len(pool):
                    pool.append(self.factories[name]())
                envs.append(pool[i])
                row_chats.append(_with(chat, _reset(pool[i], ex, name)))
        return Episodes(envs, row_chats, [list(tools) + methods(env) for env in envs])


def episodes(environments: Environments | None, examples: Sequence, chats: Sequence[list[dict]], g: int,
             tools: Sequence[Callable] = ()) -> Episodes:
    """The rows' conversations to start: each with an environment of its own when there are environments, else
    the chats and the tools as they are."""
    if environments:
        return environments.start(examples, chats, g, tools)
    return Episodes([], [chat for chat in chats for _ in range(g)], [list(tools)] * (len(chats) * g))


def _reset(env: Any, ex, name: str) -> str | None:
    """The episode's start for `ex`: reset with the keywords it takes of the row (prompt, answer, its columns)."""
    row = {"prompt": list(ex.messages) or ex.question, "answer": ex.answer, **ex.columns}
    params = inspect.signature(env.reset).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        row = {k: v for k, v in row.items() if k in {p.name for p in params}}
    try:
        observation = env.reset(**row)
    except Exception as e:
        raise EnvError(f"environment {name or type(env).__name__}: reset raised {type(e).__name__} ({str(e)[:120]}) "
                       f"on row {ex.id}: fix reset or that row") from None
    if observation is not None and not isinstance(observation, str):
        raise EnvError(f"environment {name or type(env).__name__}: reset returned a {type(observation).__name__} on "
                       f"row {ex.id}: return text (appended to the prompt) or None")
    return observation


def _with(chat: list[dict], observation: str | None) -> list[dict]:
    """The chat with the observation appended to its last message (a new list; the row's own is left as it is)."""
    if not observation:
        return chat
    return chat[:-1] + [{**chat[-1], "content": chat[-1]["content"] + observation}]
