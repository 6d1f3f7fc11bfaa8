"""`art-proxy judge`: RULER over every ready group, or `--check` of the judge itself."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import JudgeSettings
from art_proxy.errors import ConfigError, StoreError


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "judge",
        JudgeSettings,
        "Score every ready group with RULER and store the judgments.",
    )(judge)


def judge(settings: JudgeSettings) -> None:
    from art_proxy.ruler.errors import RubricError
    from art_proxy.ruler.rubric import load_rubric

    try:
        rubric = load_rubric(settings.rubric)  # before litellm's seconds-long import
        from art_proxy.ruler.command import run_judge, run_judge_check

        if settings.check:
            check = asyncio.run(run_judge_check(settings, rubric))
            Console().print(check.line(), highlight=False, soft_wrap=True)
            if not check.passed:
                raise typer.Exit(1)
            return
        asyncio.run(run_judge(settings, rubric, Console(), stderr))
    except (RubricError, ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
