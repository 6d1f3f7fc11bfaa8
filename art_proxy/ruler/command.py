"""`art-proxy judge`: score every ready group of a store, once or (--watch) until interrupted.

Progress goes to standard error while groups are judged; the summary, one screen at most, goes to
standard output at the end. The exit status is 0 even when groups failed: a `judge_failed` group
is a recorded outcome (the summary lists why), not an error of the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
)
from rich.table import Table

from art_proxy.config import JudgeSettings
from art_proxy.errors import ConfigError
from art_proxy.ids import short_id
from art_proxy.journal.left_behind import opened_for_reading
from art_proxy.privacy.pii import pii_redactor
from art_proxy.privacy.redaction import redact_url
from art_proxy.records import JudgeCheckRecord, Judgment
from art_proxy.ruler.check import JudgeCheck, check_judgments
from art_proxy.ruler.ensemble import ensemble_name
from art_proxy.ruler.judge import LitellmJudge, litellm_token_counter
from art_proxy.ruler.reward import RewardRule
from art_proxy.ruler.rubric import Rubric
from art_proxy.ruler.run import GroupJudge, Readiness, Totals, finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.serving import until_stopped
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.trackers import Tracker, open_trackers

# The run's name in the trackers of --report-to.
JUDGE_RUN = "judge"
# Failed or skipped groups listed by the summary; the rest are counted.
_FAILURES_SHOWN = 8


def build_ruler(
    settings: JudgeSettings, rubric: Rubric, store: TrajectoryStore
) -> tuple[Ruler, list[LitellmJudge]]:
    """The Ruler the settings describe, and its judge clients (the caller closes them)."""
    ruler_settings = RulerSettings(
        rubric=rubric,
        mode=settings.judge_mode,
        max_prompt_tokens=settings.judge_max_prompt_tokens,
        attempts=settings.judge_attempts,
        retries=settings.judge_retries,
        backoff=settings.judge_backoff,
        samples=settings.judge_samples,
        orders=settings.judge_orders,
        thinking_tokens=settings.judge_thinking_tokens,
        reward=RewardRule(
            mix=settings.reward_weights,
            programmatic_for_validation=settings.programmatic_for is not None,
        ),
    )
    clients = [
        LitellmJudge(
            model,
            base_url=base_url,
            api_key=settings.judge_api_key,
            temperature=settings.temperature,
            timeout=settings.judge_timeout,
        )
        for model, base_url in zip(settings.judge, settings.base_urls, strict=True)
    ]
    # One prompt for the whole ensemble: its budget is counted with the first judge's tokenizer.
    ruler = Ruler(
        clients,
        store,
        ruler_settings,
        count_tokens=litellm_token_counter(settings.judge[0]),
        redactor=pii_redactor(settings.pii_spacy_model) if settings.redact_pii else None,
    )
    return ruler, clients


@contextlib.asynccontextmanager
async def checked_ruler(
    settings: JudgeSettings, rubric: Rubric, *, existing: bool = False
) -> AsyncIterator[Ruler]:
    """The Ruler the settings describe on their store, its judges checked to answer (a
    `ConfigError` before anything is judged), closed when the block ends; `existing`: a SQLite
    store that is not there is refused, not made."""
    clients: list[LitellmJudge] = []
    async with opened_for_reading(settings.store, existing=existing) as store:
        try:
            ruler, clients = build_ruler(settings, rubric, store)
            for client in clients:
                await client.check()
            yield ruler
        finally:
            for client in clients:
                await client.aclose()


async def run_judge_check(settings: JudgeSettings, rubric: Rubric) -> JudgeCheck:
    """The judge checked on the store's newest `check_groups` groups of two or more finished
    members, each judged in at least 2 orders. Its judgments are not stored; what it found is,
    for a trainer to refuse this judge's scores when the check failed (sidecar.CheckedJudges)."""
    checked = settings.model_copy(update={"judge_orders": max(2, settings.judge_orders)})
    judgments: list[Judgment] = []
    known: dict[str, float] = {}
    async with checked_ruler(checked, rubric, existing=True) as ruler:
        for group in await ruler.store.groups(limit=settings.check_groups * 4):
            members = await finished_members(ruler.store, group.id)
            if len(members) < 2:
                continue
            known |= {m.trajectory_id: m.reward for m in members if m.reward is not None}
            judgments.append(await ruler.judgment(group.id, members))
            if len(judgments) == settings.check_groups:
                break
        if not judgments:
            raise ConfigError(
                f"nothing to check the judge on: {redact_url(settings.store)} has no group with "
                "2 finished runs (art-proxy rollout makes some)"
            )
        check = check_judgments(judgments, known, settings.judge_check_below)
        # Kept: a trainer reading this judge's judgments refuses them when it failed.
        await ruler.store.record_judge_check(
            JudgeCheckRecord(
                judge_model=judgments[0].judge_model,
                rubric_hash=judgments[0].rubric_hash,
                passed=check.passed,
                failed=check.failed,
                consistency=check.consistency,
                agreement=check.agreement,
                threshold=check.threshold,
                groups=check.groups,
                line=check.line(),
                created_at=utcnow(),
            )
        )
    return check


async def run_judge(settings: JudgeSettings, rubric: Rubric, out: Console, err: Console) -> Totals:
    """Raises `RubricError`, `ConfigError` or `StoreError` before judging anything."""
    async with checked_ruler(settings, rubric) as ruler:
        judge = GroupJudge(
            ruler,
            Readiness(settings.group_size, settings.wait),
            concurrency=settings.concurrency,
            retry_failed=settings.retry_failed,
        )
        trackers = open_trackers(
            settings, JUDGE_RUN, tensorboard=f"runs/{JUDGE_RUN}", wandb_dir=Path.cwd()
        )
        try:
            await _passes(judge, settings, err, trackers)
        finally:
            for tracker in trackers:
                tracker.close()
    out.print(summary(judge.totals, settings))
    return judge.totals


async def _passes(
    judge: GroupJudge, settings: JudgeSettings, err: Console, trackers: Sequence[Tracker]
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if settings.watch:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task("looking for ready groups", total=None)
        passes = 0
        while not stop.is_set():
            groups = await judge.ready_groups()
            progress.update(task, description="judging", total=len(groups), completed=0)
            judged = _reporter(progress, task, judge.totals, err, len(groups))
            # Ctrl-C in watch mode cancels the pass (its finished judgments are already stored)
            await until_stopped(judge.judge(groups, judged), stop)
            passes += 1
            for tracker in trackers:  # the run's totals after each pass over the ready groups
                tracker.log(judge.totals.metrics(), passes)
            if not settings.watch:
                if not groups:
                    err.print(nothing_ready(judge.waiting), highlight=False, soft_wrap=True)
                return
            progress.update(task, description=f"watching: {_progress_line(judge.totals)}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.poll)


def _reporter(
    progress: Progress, task: TaskID, totals: Totals, err: Console, total: int
) -> Callable[[Judgment], None]:
    """What each judged group updates: the bar, and on no terminal (a log, a CI job) a line."""
    done = 0

    def judged(_judgment: Judgment) -> None:
        nonlocal done
        done += 1
        progress.update(task, advance=1, description=_progress_line(totals))
        if not err.is_terminal:
            err.print(f"judged {done}/{total}: {_progress_line(totals)}")

    return judged


# Groups whose reason for waiting is listed when nothing is ready; the rest are counted.
_WAITING_SHOWN = 5


def nothing_ready(waiting: dict[str, str]) -> str:
    """Why a pass found nothing to judge, and what would change that."""
    if not waiting:
        return (
            "nothing to judge: the store has no group without a judgment by this judge, mode and "
            "rubric (--retry-failed judges judge_failed groups again)"
        )
    groups = "1 group is" if len(waiting) == 1 else f"{len(waiting)} groups are"
    lines = [f"nothing to judge yet: {groups} not ready"]
    lines += [
        f"  {short_id(group, 12)}: {reason}"
        for group, reason in list(waiting.items())[:_WAITING_SHOWN]
    ]
    if len(waiting) > _WAITING_SHOWN:
        lines.append(f"  ... and {len(waiting) - _WAITING_SHOWN} more")
    if any("still open" in reason for reason in waiting.values()):
        lines.append(
            "a run finishes when the proxy has had no call of it for --idle-timeout seconds (300 "
            "by default), or at once with POST /art/v1/trajectories/{id}/finish; --watch judges "
            "each group as it gets ready"
        )
    return "\n".join(lines)


def _progress_line(totals: Totals) -> str:
    return f"{totals.scored} scored, {totals.judge_failed} failed, {totals.skipped} skipped"


def summary(totals: Totals, settings: JudgeSettings) -> Table:
    name = ensemble_name(settings.judge, settings.judge_samples)
    title = f"art-proxy judge: {name} ({settings.judge_mode})"
    table = Table(title=title, title_justify="left", show_header=False, min_width=len(title))
    table.add_column(justify="right")
    table.add_column()
    rows = [
        (totals.scored, "scored"),
        (totals.judge_failed, "judge_failed"),
        (totals.skipped, "skipped"),
        (totals.cache_hits, "answered from the cache"),
    ]
    if totals.failed_members:
        rows.append((totals.failed_members, "ensemble members failed (see members)"))
    for count, label in rows:
        table.add_row(str(count), label)
    table.add_section()
    table.add_row(str(totals.calls), "judge calls")
    table.add_row(f"{totals.prompt_tokens:,}", "prompt tokens")
    table.add_row(f"{totals.completion_tokens:,}", "completion tokens")
    table.add_row(f"${totals.cost_usd:.4f}", "cost")
    if totals.failures:
        table.add_section()
        for judgment in totals.failures[:_FAILURES_SHOWN]:
            table.add_row(judgment.status, f"{short_id(judgment.group_id, 12)}: {judgment.reason}")
        hidden = len(totals.failures) - _FAILURES_SHOWN
        if hidden > 0:
            table.add_row("...", f"{hidden} more, all in the store's judgments table")
    return table
