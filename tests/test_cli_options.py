"""Each command's flags are read off its settings model: a switch that defaults to on can be
switched off (`--no-swap`, `--no-gradient-checkpointing`)."""

from __future__ import annotations

import logging
import re

import pytest
import typer
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from art_proxy.cli.options import settings_command
from art_proxy.config.shared import StoreSettings


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
    from art_proxy.cli.output import configure_logging

    root, httpx = logging.getLogger(), logging.getLogger("httpx")
    levels = root.level, httpx.level
    try:
        httpx.setLevel(logging.NOTSET)
        root.setLevel(logging.INFO)  # what the command's basicConfig sets in its own process
        configure_logging()
        assert not httpx.isEnabledFor(logging.INFO)
    finally:
        root.setLevel(levels[0])
        httpx.setLevel(levels[1])


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("mine.db", "sqlite:///mine.db"),
        ("sqlite:/mine.db", "sqlite:///mine.db"),  # once: sqlite:///sqlite:/mine.db
        ("mysql://u@h/db", "sqlite:///FILE"),
    ],
)
def test_a_store_that_is_no_database_url_is_told_the_sqlite_url_it_meant(
    given: str, hint: str
) -> None:
    with pytest.raises(ValidationError, match=f"{re.escape(hint)} for a SQLite file"):
        StoreSettings(store=given)


def test_a_postgres_url_as_hosts_hand_them_out_is_taken() -> None:
    assert StoreSettings(store="postgres://u@h/db").store == "postgresql://u@h/db"
    taken = StoreSettings(store="postgres+asyncpg://u@h/db").store
    assert taken == "postgresql+asyncpg://u@h/db"
