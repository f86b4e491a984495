"""A time limit on a call of user code (a reward function) that stays in the main thread: a watchdog thread sends the
main thread a signal when the limit passes or a stop is requested, and the signal's handler raises `Interrupted` in
the call, wherever it waits (a sleep, a lock, a subprocess, a socket) or loops in Python.

The call is not moved to another thread, so code that sets signal handlers of its own (math_verify's SIGALRM
timeouts, which refuse to run outside the main thread) works as before. Code stuck inside one C call that never
returns to Python (a regular expression that backtracks for hours) is interrupted only when that call returns."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

# SIGURG: ignored by default, and nothing here or in the libraries a reward uses sets it, so a signal that arrives
# after the call ended (the handler put back) does nothing
_SIGNAL = getattr(signal, "SIGURG", None)
POLL_S = 0.05  # how often the watchdog looks at the clock and the stop request


class Interrupted(BaseException):
    """Raised inside the limited call. A BaseException, as KeyboardInterrupt is, so that a reward function's own
    `except Exception` does not swallow it. `reason`: "time" (the limit passed) or "stop" (a stop was requested)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def available() -> bool:
    """Whether a call here can be limited: in the main thread, on a system with the signal and pthread_kill."""
    return _SIGNAL is not None and hasattr(signal, "pthread_kill") and \
        threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def limit(seconds: float, stop=None):
    """The body, interrupted (Interrupted raised in it) after `seconds` (0: no limit) or as soon as `stop()` is true.
    Where no call can be limited (available() is false) the body runs as it is.

    >>> with limit(0.2):
    ...     time.sleep(0.01)
    >>> try:
    ...     with limit(0.2):
    ...         time.sleep(30)
    ... except Interrupted as e:
    ...     print(e.reason)
    time
    """
    if (seconds <= 0 and stop is None) or not available():
        yield
        return
    state = {"armed": True, "why": ""}
    lock, done = threading.Lock(), threading.Event()

    def on_signal(signum, frame):
        if state["armed"] and state["why"]:
            state["armed"] = False  # once: the clean-up below is never interrupted twice
            raise Interrupted(state["why"])

    def watch(main: int, deadline: float) -> None:
        while not done.wait(POLL_S):
            why = "stop" if stop is not None and stop() else "time" if time.monotonic() >= deadline else ""
            if why:
                with lock:
                    if not done.is_set():
                        state["why"] = why
                        signal.pthread_kill(main, _SIGNAL)
                return

    old = signal.signal(_SIGNAL, on_signal)
    deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
    watcher = threading.Thread(target=watch, args=(threading.get_ident(), deadline), name="time-limit", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        try:
            state["armed"] = False  # the body is over: a signal that comes now raises nothing
        finally:
            with lock:  # no signal is sent from here on
                done.set()
            signal.signal(_SIGNAL, old)
            watcher.join()
