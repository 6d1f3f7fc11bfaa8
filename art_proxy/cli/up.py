"""`art-proxy up`: the embedded stack (art_proxy/up/)."""

from __future__ import annotations

import asyncio

import typer

from art_proxy.cli.options import settings_command
from art_proxy.config import UpSettings


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "up",
        UpSettings,
        "Start the embedded stack: inference server and proxy (Ctrl-C stops).",
    )(up)


def up(settings: UpSettings) -> None:
    from art_proxy.up.run import run_stack

    status = asyncio.run(run_stack(settings))
    if status:
        raise typer.Exit(status)
