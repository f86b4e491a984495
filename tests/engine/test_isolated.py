"""engine.isolated: an object in a spawned child process; its results and errors come back, its death by a signal
becomes NativeCrash and this process goes on."""

from __future__ import annotations

import os
import signal

import pytest

from cpu_grpo.engine.isolated import Isolated, signal_name
from cpu_grpo.errors import NativeCrash, UserError


class Counter:
    """Runs in the child: counts, refuses, dies."""

    def __init__(self, start: int):
        if start < 0:
            raise UserError("start must be >= 0")
        self.n, self.pid = start, os.getpid()

    def add(self, k: int) -> tuple[int, int]:
        self.n += k
        return self.n, self.pid

    def fail(self) -> None:
        raise ValueError("no such row")

    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


def test_calls_run_in_a_child_that_keeps_its_state():
    with Isolated("counter", Counter, 2) as c:
        assert c.add(3)[0] == 5
        n, pid = c.add(1)
        assert n == 6 and pid != os.getpid()


def test_an_error_raised_in_the_child_is_raised_here_and_the_child_goes_on():
    with pytest.raises(UserError, match="start must be >= 0"):
        Isolated("counter", Counter, -1)
    with Isolated("counter", Counter, 0) as c:
        with pytest.raises(ValueError, match="no such row"):
            c.fail()
        assert c.add(1)[0] == 1


def test_a_death_by_signal_is_one_sentence_and_this_process_goes_on():
    c = Isolated("llama.cpp", Counter, 0)
    with pytest.raises(NativeCrash, match=r"^llama.cpp crashed \(SIGSEGV\)$"):
        c.die()
    c.close()  # a dead child closes without a word
    assert signal_name(-9) == "SIGKILL" and signal_name(3) == "exit code 3"
