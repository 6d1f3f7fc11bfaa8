"""The `art-proxy` typer app, assembled: the root options, then each command module's commands in
the order `art-proxy --help` lists them."""

from __future__ import annotations

from typing import Annotated

import typer

from art_proxy.cli import (
    alias,
    evaluate,
    export,
    journal,
    judge,
    local_llm,
    privacy,
    rollout,
    scenarios,
    serve,
    train,
    up,
)
from art_proxy.cpu_sharing import share_cpu_cores

app = typer.Typer(
    name="art-proxy",
    help="Record an agent's LLM calls as trajectories (with token ids) and train it on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click errors: a usage mistake is one `Error: ...` line, not a wrapped panel.
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"art-proxy {version('art-proxy')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Record an agent's LLM calls as trajectories (with token ids) and train it on them."""


serve.register(app)
export.register(app)
scenarios.register(app)
judge.register(app)
scenarios.register_group(app)
journal.register(app)
privacy.register(app)
alias.register(app)
local_llm.register(app)
train.register(app)
up.register(app)
rollout.register(app)
evaluate.register(app)


def main() -> None:
    share_cpu_cores()  # before any command imports torch
    app()
