"""Calling a reward function on a batch of completions: its values checked (one float or None each, finite,
bounded), an `async def` one run to its end, a row on which it raises scored 0 with one warning, a time limit,
and a stop request honoured while it runs."""

from __future__ import annotations

import asyncio
import inspect
import math
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import RewardError
from . import timelimit

RewardFn = Callable[..., list[float]]

MAX_REWARD = 1e6  # a reward's size: its square, summed over a group, must stay finite in float32 (3.4e38)


def as_scores(name: str, values: Any, n: int) -> list[float]:
    """A reward function's output as n floats (None -> nan: "cannot score this one"), or a RewardError that names
    the function and says what it returned.

    >>> as_scores("mine", [1, None, 0.5, True], 4)
    [1.0, nan, 0.5, 1.0]
    """
    if not isinstance(values, list | tuple) or len(values) != n:
        got = f"{type(values).__name__} of length {len(values)}" if isinstance(values, list | tuple) else \
            f"{type(values).__name__} {str(values)[:40]!r}"
        raise RewardError(f"reward function {name} returned a {got} for {n} completions: return a list of one float "
                          "(or None) per completion")
    out = []
    for v in values:
        try:
            if isinstance(v, str):  # float("1.0") would pass: a reward is a number, not text
                raise TypeError
            x = math.nan if v is None else float(v.item() if hasattr(v, "item") else v)
        except (TypeError, ValueError):
            raise RewardError(f"reward function {name} returned {str(v)[:40]!r} ({type(v).__name__}): return "
                              "floats, or None for a completion it cannot score") from None
        if math.isinf(x) or abs(x) > MAX_REWARD:
            raise RewardError(f"reward function {name} returned {x:g}: return finite floats within +-{MAX_REWARD:g} "
                              "(scale it; beyond that the group's spread overflows and no update is made), or None "
                              "for a completion it cannot score")
        out.append(x)
    return out


TIMEOUTS_IN_A_ROW = 3  # batches in a row on which a reward function passed its time limit, before the run stops
_late: dict[str, int] = {}  # a reward function's name -> batches in a row on which it passed its time limit


class RewardStopped(Exception):
    """A stop was requested while a reward function ran: the batch is not scored."""


def call_reward(fn: RewardFn, completions: list, columns: dict, ids: Sequence[str], log=print, limit: float = 0.0,
                stop=None) -> list[float]:
    """fn on the completions; when it raises, again one completion at a time: those on which it raises score 0,
    with one warning that names the function, the first row and where it raised; if it raises on every one, the
    run stops with that sentence. A wrong return (shape or type) stops it at once: that is a bug, not a row.

    With `limit` (seconds, 0: none), a call still running then is interrupted: the batch scores 0, with one warning
    that names the function and the limit; on TIMEOUTS_IN_A_ROW batches in a row, the run stops with one sentence.
    `stop()` turning true interrupts it too: RewardStopped (timelimit.py says how, and what cannot be interrupted)."""
    name = getattr(fn, "__name__", "reward")
    try:
        with timelimit.limit(limit, stop):
            values = _scores(fn, name, completions, columns, ids, log)
    except timelimit.Interrupted as e:
        if e.reason == "stop":
            raise RewardStopped(f"a stop was requested while reward function {name} ran") from None
        _late[name] = _late.get(name, 0) + 1
        if _late[name] >= TIMEOUTS_IN_A_ROW:
            del _late[name]
            raise RewardError(f"reward function {name} ran past its limit of {limit:g} s on {TIMEOUTS_IN_A_ROW} "
                              "batches in a row: fix it (a loop that never ends, a wait for something that never "
                              "comes), or give it more time with --reward-timeout") from None
        log(f"warning: reward function {name} ran past its limit of {limit:g} s on a batch of {len(completions)} "
            "completions, which scored 0: give it more time with --reward-timeout if it needs it")
        return [0.0] * len(completions)
    _late.pop(name, None)
    return values


def _scores(fn: RewardFn, name: str, completions: list, columns: dict, ids: Sequence[str], log) -> list[float]:
    """call_reward's scores, with no time limit."""
    try:
        return as_scores(name, _called(fn, completions, columns), len(completions))
    except RewardError:
        raise
    except Exception:  # one row may be the cause: find it
        pass
    values, failed = [], []
    for i, completion in enumerate(completions):
        try:
            values += as_scores(name, _called(fn, [completion], {k: v[i:i + 1] for k, v in columns.items()}), 1)
        except RewardError:
            raise
        except Exception as e:
            values.append(0.0)
            failed.append((ids[i], e))
    if failed:
        row, e = failed[0]
        where = traceback.extract_tb(e.__traceback__)[-1]
        what = (f"reward function {name} raised {type(e).__name__} ({str(e)[:120]}) at {where.filename}:"
                f"{where.lineno} on row {row}")
        if len(failed) == len(completions):
            raise RewardError(f"{what}, and on every other completion of the step: fix the function")
        log(f"warning: {what} and {len(failed) - 1} more of {len(completions)} completions: those scored 0")
    return values


def _called(fn: RewardFn, completions: list, columns: dict):
    """What fn returns on these completions; an `async def` reward function is run to its end (TRL takes both)."""
    values = fn(completions=completions, **columns)
    return asyncio.run(values) if inspect.isawaitable(values) else values
