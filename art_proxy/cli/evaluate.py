"""`art-proxy eval`: models side by side on held-out scenarios (art_proxy/evaluation)."""

from __future__ import annotations

import typer
from rich.console import Console

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import configure_logging, fail, stderr
from art_proxy.config import EvalSettings
from art_proxy.errors import ConfigError, StoreError


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "eval",
        EvalSettings,
        "Run an agent on held-out scenarios against several models at once (--model each: base, "
        "an adapter, a hosted model) and report each one's reward with its 95% interval, the "
        "paired difference to the first, latency, tokens and cost.",
    )(eval_)


def eval_(settings: EvalSettings) -> None:
    from art_proxy.evaluation.command import evaluate
    from art_proxy.ruler.errors import RubricError

    configure_logging("warning")
    try:
        report = evaluate(settings, Console(), stderr)
    except (ConfigError, RubricError, StoreError) as exc:
        fail(str(exc))
    if not any(arm.rollouts > arm.failed for arm in report.arms):
        fail("no arm completed a rollout")
