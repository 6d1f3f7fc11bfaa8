"""A part of the stack: a child process with a health check, how it failed, and the flags its
command line is written with."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from rich.console import Console

from art_proxy.records import JsonObject

# Soft wrap: commands, URLs and a part's log lines stay whole lines, to copy or grep.
console = Console(stderr=True, highlight=False, soft_wrap=True)
_TAIL_LINES = 15


class StackError(Exception):
    """A part failed to start or died; the message says which and shows its last lines."""


class Interrupted(StackError):
    """Ctrl-C (or SIGTERM) came while the stack was working."""


@dataclass
class Part:
    name: str
    argv: list[str]
    health_url: str | None  # None: ready once started (a part without a health check)
    ready_timeout_s: float
    color: str
    env: dict[str, str] = field(default_factory=dict)
    first_request: tuple[str, JsonObject] | None = None  # (URL, body) posted once it is ready
    process: asyncio.subprocess.Process | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    def died(self) -> StackError:
        code = self.process.returncode if self.process else None
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return StackError(f"{self.name} exited with status {code}; its last lines:\n{lines}")


def flags(**values: object) -> list[str]:
    """`flags(max_loras=4)` -> `["--max-loras", "4"]`; True is a bare flag, None is left out."""
    argv: list[str] = []
    for name, value in values.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv
