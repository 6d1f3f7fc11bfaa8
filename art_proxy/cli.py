"""`art-proxy`: the command line. Each command's flags come from its settings model (config.py)."""

from __future__ import annotations

import asyncio
import logging
import sys
from contextlib import nullcontext
from typing import IO

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from art_proxy.cli_options import settings_command
from art_proxy.config import ExportSettings, JudgeSettings, ProxySettings, UpSettings
from art_proxy.errors import ConfigError, StoreError
from art_proxy.local.cli import LocalLlmSettings

app = typer.Typer(
    name="art-proxy",
    help="Record an agent's LLM calls as trajectories (with token ids) and train it on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click errors: a usage mistake is one `Error: ...` line, not a wrapped panel.
    rich_markup_mode=None,
)
stderr = Console(stderr=True)


def _configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=stderr, show_path=False, rich_tracebacks=False)],
    )
    # aiohttp's access log would print every request; secrets never reach it, but noise would.
    # Alembic narrates every migration check at start-up.
    for chatty in ("aiohttp.access", "alembic"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _fail(message: str) -> None:
    stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@settings_command(
    app, "serve", ProxySettings, "Serve the recording proxy in front of the upstream(s)."
)
def serve(settings: ProxySettings) -> None:
    from art_proxy.proxy.server import serve as serve_forever

    _configure_logging()
    try:
        serve_forever(settings)
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))


@settings_command(app, "export", ExportSettings, "Write trajectories as JSONL, one a line.")
def export(settings: ExportSettings) -> None:
    try:
        with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
            count = asyncio.run(_export(settings, out))
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    else:
        where = "standard output" if settings.out == "-" else settings.out
        stderr.print(f"exported {count} trajectories to {escape(where)}")


async def _export(settings: ExportSettings, out: IO[str]) -> int:
    from art_proxy.store.trajectory_store import TrajectoryStore

    store = await TrajectoryStore.open(settings.store, writer=False)
    count = 0
    try:
        with stderr.status("exporting...") as status:
            async for exported in store.export(
                scenario=settings.scenario, status=settings.status, split=settings.split
            ):
                out.write(exported.model_dump_json() + "\n")
                count += 1
                status.update(f"exported {count} trajectories")
    finally:
        await store.aclose()
    return count


@settings_command(
    app, "judge", JudgeSettings, "Score every ready group with RULER and store the judgments."
)
def judge(settings: JudgeSettings) -> None:
    from art_proxy.ruler.errors import RubricError
    from art_proxy.ruler.rubric import load_rubric

    try:
        rubric = load_rubric(settings.rubric)  # before litellm's seconds-long import
        from art_proxy.ruler.command import run_judge

        asyncio.run(run_judge(settings, rubric, Console(), stderr))
    except (RubricError, ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))


@settings_command(
    app,
    "local-llm",
    LocalLlmSettings,
    "Serve a model on CPU behind vLLM's OpenAI API, runtime LoRA included (no GPU, no vLLM).",
)
def local_llm(settings: LocalLlmSettings) -> None:
    # Imported here: torch and transformers load only when this command runs.
    from art_proxy.local.cli import run_local_llm
    from art_proxy.local.errors import ModelLoadError

    _configure_logging()
    try:
        run_local_llm(settings)
    except (ModelLoadError, OSError) as exc:
        _fail(str(exc))


@settings_command(
    app, "up", UpSettings, "Start the embedded stack: inference server and proxy (Ctrl-C stops)."
)
def up(settings: UpSettings) -> None:
    from art_proxy.up import run_stack

    status = asyncio.run(run_stack(settings))
    if status:
        raise typer.Exit(status)


def main() -> None:
    app()
