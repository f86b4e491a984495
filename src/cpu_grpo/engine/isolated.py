"""An object that lives in a child process of its own, so that a crash in its native code (llama.cpp) ends the
child, not the command: each method call is sent through a pipe and its result comes back; a child that dies raises
NativeCrash naming the signal. pytest-forked contains native crashes the same way, a process per test; the child is
spawned, not forked, because a fork of a process whose OpenMP threads have run (torch's) hangs at its first parallel
region."""

from __future__ import annotations

import multiprocessing
import signal
import traceback

from ..errors import NativeCrash


def _serve(conn, cls, args: tuple, kw: dict) -> None:
    """The child: build cls(*args, **kw), then answer (method, args, kw) calls until told to stop (None)."""
    try:
        obj = cls(*args, **kw)
        conn.send(("ok", None))
    except Exception as e:
        conn.send(("error", _portable(e)))
        return
    while (call := conn.recv()) is not None:
        name, a, k = call
        try:
            conn.send(("ok", getattr(obj, name)(*a, **k)))
        except Exception as e:
            conn.send(("error", _portable(e)))
    close = getattr(obj, "close", None)
    if close:
        close()


def _portable(e: Exception) -> Exception:
    """`e` as it can cross the pipe: itself where it pickles, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError("".join(traceback.format_exception_only(e)).strip())


def signal_name(exitcode: int | None) -> str:
    """How a child process ended, in words: 'SIGSEGV' for a death by signal 11, 'exit code 3' otherwise."""
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class Isolated:
    """`cls(*args, **kw)` built in a spawned child; `obj.method(...)` runs there and returns its result (an
    exception raised there is raised here). `what` names it in NativeCrash's sentence. A context manager."""

    def __init__(self, what: str, cls, *args, **kw):
        ctx = multiprocessing.get_context("spawn")
        self.what, (self._conn, theirs) = what, ctx.Pipe()
        self._child = ctx.Process(target=_serve, args=(theirs, cls, args, kw), daemon=True)
        self._child.start()
        theirs.close()
        self._answer()

    def _answer(self):
        try:
            kind, value = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._child.join(5)
            raise NativeCrash(f"{self.what} crashed ({signal_name(self._child.exitcode)})") from None
        if kind == "error":
            raise value
        return value

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args, **kw):
            self._conn.send((name, args, kw))
            return self._answer()

        return call

    def close(self) -> None:
        """Stop the child (it frees what it holds), or end it if it does not answer."""
        if self._child.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._child.join(10)
        if self._child.is_alive():
            self._child.kill()
            self._child.join()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
