"""Each command's flags are read off its settings model: a switch that defaults to on can be
switched off (`--no-swap`, `--no-gradient-checkpointing`)."""

from __future__ import annotations

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
