"""Progress where no live line shows (a pipe, a log file, `up` relaying a part's output): a
command's long work as printed lines, so that no minute passes without one. On a terminal the
live progress bar says it, and these print nothing."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

EVERY_S = 15.0  # the most often one task's count is printed


class ProgressLines:
    def __init__(self, console: Console, every_s: float = EVERY_S) -> None:
        self._console = console
        self._every_s = every_s
        self._printed: dict[str, tuple[float, int, int]] = {}  # task -> when, done, total
        self._said = ""

    @property
    def live(self) -> bool:
        """A terminal shows the live line instead."""
        return self._console.is_terminal

    def say(self, text: str) -> None:
        """A new status (what the command does now), printed once."""
        if self.live or text == self._said:
            return
        self._said = text
        self._console.print(escape(text), highlight=False, soft_wrap=True)

    def count(self, task: str, done: int, total: int) -> None:
        """`done` of `total` of `task`: the first, the last, and at most one a `every_s`."""
        if self.live:
            return
        now = time.monotonic()
        last = self._printed.get(task)
        if last is not None and (last[1], last[2]) == (done, total):
            return
        if last is None or done >= total or now - last[0] >= self._every_s:
            self._printed[task] = (now, done, total)
            self._console.print(f"{escape(task)}: {done}/{total}", highlight=False, soft_wrap=True)
