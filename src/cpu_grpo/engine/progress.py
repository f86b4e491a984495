"""How far a long phase is: a rollout's decode steps, the Fisher's samples, an export's tensors."""

from __future__ import annotations

import sys
import time

PROGRESS_EVERY = 30.0  # seconds between two progress lines of one rollout (an evaluation batch, a step's sampling)
BAR_EVERY = 0.5  # seconds between two redraws of a progress bar on a terminal


class ProgressLines:
    """A callback `tick(done, of_at_most)` that says `what` with how far it is, the rate and the most time left (a
    decode step's Sampling.progress; the Fisher's samples; an export's tensors): a batch of 200 problems on a busy
    machine took 10 minutes without a word. To a log, a line at most every PROGRESS_EVERY seconds; on a terminal
    (`log` is print and stdout a tty), a bar redrawn in place, ended by `end()` (Sampler.generate calls it)."""

    def __init__(self, log, what: str, unit: str = "token", rate: str = "tokens/s a row", bar: bool | None = None):
        self.log, self.what, self.unit, self.rate = log, what, unit, rate
        self.bar = (log is print and sys.stdout.isatty()) if bar is None else bar
        self.start = self.last = time.time()
        self.drawn = False

    def __call__(self, done: int, limit: int) -> None:
        now = time.time()
        if now - self.last < (BAR_EVERY if self.bar else PROGRESS_EVERY):
            return
        self.last, each = now, (now - self.start) / done
        how = f"{1 / each:.1f} {self.rate}, at most {each * (limit - done):.0f} s left"
        if not self.bar:
            self.log(f"{self.what}: {self.unit} {done} of at most {limit}, {how}")
            return
        filled = round(20 * done / max(limit, 1))
        sys.stdout.write(f"\r{self.what}: [{'#' * filled}{'.' * (20 - filled)}] {done}/{limit} {how}\033[K")
        sys.stdout.flush()
        self.drawn = True

    def end(self) -> None:
        """The phase is over: a bar drawn on a terminal gets its line ended (a log needs nothing)."""
        if self.drawn:
            sys.stdout.write("\n")
            self.drawn = False
