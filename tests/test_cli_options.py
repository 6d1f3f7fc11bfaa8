"""Each command's flags are read off its settings model: a switch that defaults to on can be
switched off (`--no-swap`, `--no-gradient-checkpointing`)."""

from __future__ import annotations

import logging

import typer
from pydantic import BaseModel
from typer.testing import CliRunner

from art_proxy.cli_options import settings_command


class Switches(BaseModel):
    swap: bool = True
    resume: bool = False


def test_a_switch_goes_both_ways_and_keeps_its_default() -> None:
    app = typer.Typer()
    seen: list[Switches] = []

    @settings_command(app, "run", Switches, "Run.")
    def run(settings: Switches) -> None:
        seen.append(settings)

    @app.command("other")
    def other() -> None:  # two commands: typer then keeps the command names
        pass

    runner = CliRunner()
    for argv, expected in (
        ([], (True, False)),
        (["--no-swap"], (False, False)),
        (["--swap", "--resume"], (True, True)),
    ):
        result = runner.invoke(app, ["run", *argv])
        assert result.exit_code == 0, result.output
        assert (seen[-1].swap, seen[-1].resume) == expected


def test_commands_that_log_leave_out_each_request_of_the_agents_http_client() -> None:
    """`train --agent` logs at INFO, and the OpenAI SDK's httpx logs each request at INFO: a
    `make demo` log was 3,280 such lines of 3,362."""
    from art_proxy import cli

    root, httpx = logging.getLogger(), logging.getLogger("httpx")
    levels = root.level, httpx.level
    try:
        httpx.setLevel(logging.NOTSET)
        root.setLevel(logging.INFO)  # what the command's basicConfig sets in its own process
        cli._configure_logging()
        assert not httpx.isEnabledFor(logging.INFO)
    finally:
        root.setLevel(levels[0])
        httpx.setLevel(levels[1])
