"""What every command writes besides its result: logs, progress and one-line errors, on standard
error."""

from __future__ import annotations

import logging
from typing import NoReturn

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

stderr = Console(stderr=True)


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=stderr, show_path=False, rich_tracebacks=False)],
    )
    # aiohttp's access log would print every request; secrets never reach it, but noise would.
    # Alembic narrates every migration check at start-up; litellm logs every judge call at INFO
    # (twice: through its own handler and ours); httpx (the OpenAI SDK's, so every agent's) logs
    # every request at INFO: 3,280 of the 3,362 lines of a `make demo` log were its.
    # httpx2: the OpenAI SDK 3's client, which logs as httpx did.
    for chatty in ("aiohttp.access", "alembic", "LiteLLM", "LiteLLM Router", "httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def fail(message: str) -> NoReturn:
    """End the command with one `error: ...` line and exit status 1."""
    stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)
