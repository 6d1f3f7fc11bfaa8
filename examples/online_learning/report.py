"""What the simulation prints: a line per round, and a one-screen summary at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.box import SIMPLE
from rich.markup import escape
from rich.table import Table

from art_proxy.up.parts import console

from .api import ArtApi
from .stack import CANDIDATE_ALIAS, PROD_ALIAS, RUN
from .traffic import RoundReport


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def round_line(report: RoundReport) -> str:
    calls = len(report.conversations)
    return (
        f"[bold]round {report.number}[/]: prod reward {_number(report.prod_reward)} over "
        f"{calls} calls, {report.shadow_samples} shadow samples, {report.feedback} feedback; "
        f"val reward of {CANDIDATE_ALIAS} {_number(report.val_reward)}; "
        f"trainer steps {report.steps}; {PROD_ALIAS} -> {escape(report.serving)}"
    )


async def print_summary(api: ArtApi, reports: Sequence[RoundReport]) -> None:
    # Narrow enough for 80 columns: a pipe gets no wider console.
    title = "round by round (prod, val: mean rewards; steps: so far)"
    rounds = Table(title=title, title_justify="left", box=SIMPLE)
    for column in ("round", "prod calls", "shadow", "prod", "val", "steps"):
        rounds.add_column(column, justify="right")
    rounds.add_column(f"{PROD_ALIAS} serves", no_wrap=True)
    for report in reports:
        rounds.add_row(
            str(report.number),
            str(len(report.conversations)),
            str(report.shadow_samples),
            _number(report.prod_reward),
            _number(report.val_reward),
            str(report.steps),
            escape(report.serving),
        )
    console.print(rounds)

    steps = await api.training_steps(RUN)
    applied = sum(step.status == "applied" for step in steps)
    failed = sum(r.shadow_failed for r in reports)
    console.print(
        f"{len(reports)} rounds: {sum(len(r.conversations) for r in reports)} prod calls, "
        f"{sum(r.shadow_samples for r in reports)} shadow samples ({failed} failed), "
        f"{sum(r.feedback for r in reports)} feedback given; {len(steps)} trainer steps "
        f"({applied} applied)"
    )
    # One line a move, whole: the notes are the evidence, to read and to grep.
    console.print(f"[bold]moves of the production alias {PROD_ALIAS!r}[/] (oldest first):")
    for move in await api.alias_moves(PROD_ALIAS):
        note = f": {escape(move.note)}" if move.note else ""
        console.print(
            f"  {move.moved_at:%H:%M:%S} {move.reason:<8} {escape(move.previous or '-')} -> "
            f"{escape(move.model)}{note}"
        )
    swaps = len(await api.alias_moves(CANDIDATE_ALIAS))
    console.print(
        f"{CANDIDATE_ALIAS!r} moved {swaps} times (to the base model at the start, then once per "
        "swapped step)"
    )
