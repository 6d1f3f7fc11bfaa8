"""The dashboard's pages: groups, one group side by side, one trajectory's raw calls, training,
production (the aliases' canaries), evaluations.

Each handler reads the store and renders a Jinja2 template with autoescape on, which is the escaping
guarantee: trajectory content is untrusted and reaches the page only as text. Pages are whole
documents; the script re-fetches the page every two seconds and swaps its `data-live` regions, so
there is no second, JSON-shaped view of the same data to keep in step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from art_proxy.evaluation.report import headers, notes, rows, title
from art_proxy.privacy.pii import (
    PiiRedactor,
    Placeholders,
    redacted_call,
    redacted_evaluation,
    redacted_judgment,
    redacted_teacher_score,
    redacted_trajectory,
)
from art_proxy.records import (
    SPLITS,
    AliasMove,
    AliasRecord,
    CallRecord,
    CanaryLook,
    GroupOutcome,
    JsonObject,
    Judgment,
    TrajectoryRecord,
    TrajectoryScore,
)
from art_proxy.store.dashboard import GROUP_STATUSES, DashboardQueries, GroupFilter, GroupSummary
from art_proxy.store.trajectory_store import TrajectoryStore

from .canary_chart import canary_chart
from .evaluation_chart import evaluation_chart
from .plots import Chart
from .render import MessageView, call_view, conversation, message_view, shared_prefix
from .training_charts import reward_chart, training_charts

StoreOf = Callable[[web.Request], TrajectoryStore]
RedactorOf = Callable[[web.Request], PiiRedactor | None]

PAGE_SIZE = 50
STATIC_FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}
# Steps of a run plotted: more points than a chart is wide are not readable anyway.
MAX_STEPS = 2000
MAX_MOVES = 200
MAX_EVALUATIONS = 20
MAX_LOOKS = 2000  # a canary's looks charted: one per change of its evidence


@dataclass(frozen=True)
class CanaryView:
    """An alias's newest canary, running or decided, as the production page shows it."""

    alias: AliasRecord
    started: AliasMove  # the move that began it
    running: bool
    looks: list[CanaryLook]  # oldest first
    chart: Chart | None
    moves: list[AliasMove]  # the alias's history, newest first
    stages: int  # its shares so far (a widening is a stage)


@dataclass(frozen=True)
class Column:
    """One trajectory of a group, as its column shows it."""

    trajectory: TrajectoryRecord
    score: TrajectoryScore | None
    messages: list[MessageView]  # after the beginning every member shares
    failed_calls: list[CallRecord]


class Dashboard:
    def __init__(self, store_of: StoreOf, redactor_of: RedactorOf) -> None:
        self._store_of = store_of
        self._redactor_of = redactor_of
        self._templates = _environment()

    def _placeholders(self, request: web.Request) -> Placeholders | None:
        """One page's scope of placeholders, when personal data is to be redacted (privacy/pii.py)."""
        redactor = self._redactor_of(request)
        return redactor.placeholders() if redactor is not None else None

    async def overview(self, request: web.Request) -> web.Response:
        store = self._store_of(request)
        where = _group_filter(request.query)
        queries = DashboardQueries(store.engine)
        groups = await queries.group_page(where)
        placeholders = self._placeholders(request)
        if placeholders is not None:
            groups = [_redacted_summary(group, placeholders) for group in groups]
        runs = await queries.runs()
        run = runs[0] if runs else None
        reward = reward_chart(await store.training_steps(run, MAX_STEPS)) if run else None
        return self._page(
            "overview.html",
            where=where,
            groups=groups,
            splits=SPLITS,
            statuses=GROUP_STATUSES,
            run=run,
            reward_chart=reward,
            older=_page_link(where, where.offset + PAGE_SIZE) if len(groups) == PAGE_SIZE else None,
            newer=_page_link(where, max(where.offset - PAGE_SIZE, 0)) if where.offset else None,
        )

    async def group(self, request: web.Request) -> web.Response:
        store = self._store_of(request)
        group_id = request.match_info["group"]
        members = await store.trajectories(group=group_id, limit=1000, oldest_first=True)
        if not members:
            return self._not_found(f"No group {group_id!r} in the store.")
        judgments = await store.judgments(group=group_id)
        # The scores shown are the newest scored judgment's, the ones the trainer reads.
        judgment = next((j for j in judgments if j.status == "scored"), None) or next(
            iter(judgments), None
        )
        members = _in_judged_order(members, judgment)
        calls = await store.calls([member.id for member in members])
        placeholders = self._placeholders(request)
        if placeholders is not None:
            calls = {
                trajectory: [redacted_call(call, placeholders) for call in own]
                for trajectory, own in calls.items()
            }
            judgments = [redacted_judgment(other, placeholders) for other in judgments]
            judgment = next((j for j in judgments if judgment and j.id == judgment.id), None)
        conversations = [conversation(calls.get(member.id, [])) for member in members]
        shared = shared_prefix(conversations)
        scores = {score.trajectory_id: score for score in judgment.scores} if judgment else {}
        columns = [
            Column(
                trajectory=member,
                score=scores.get(member.id),
                messages=messages[shared:],
                failed_calls=[call for call in calls.get(member.id, []) if call.status != "ok"],
            )
            for member, messages in zip(members, conversations, strict=True)
        ]
        return self._page(
            "group.html",
            group_id=group_id,
            scenario_id=members[0].scenario_id,
            split=members[0].split,
            judgment=judgment,
            other_judgments=[other for other in judgments if other is not judgment],
            shared=conversations[0][:shared],
            columns=columns,
            consumptions=await DashboardQueries(store.engine).consumptions(group_id),
        )

    async def trajectory(self, request: web.Request) -> web.Response:
        store = self._store_of(request)
        trajectory_id = request.match_info["trajectory"]
        found = await store.trajectory(trajectory_id)
        if found is None:
            return self._not_found(f"No trajectory {trajectory_id!r} in the store.")
        placeholders = self._placeholders(request)
        taught = await store.teacher_scores(trajectory_id)
        if placeholders is not None:
            raw = {call.id: call for call in found.calls or []}
            taught = [redacted_teacher_score(s, raw.get(s.call_id), placeholders) for s in taught]
            found = redacted_trajectory(found, placeholders)
        calls = found.calls or []
        seq = {call.id: call.seq for call in calls}
        return self._page(
            "trajectory.html",
            trajectory=found,
            messages=conversation(calls),
            calls=[call_view(call) for call in calls],
            taught=[(seq.get(score.call_id), score) for score in taught],
        )

    async def training(self, request: web.Request) -> web.Response:
        store = self._store_of(request)
        runs = await DashboardQueries(store.engine).runs()
        run = request.query.get("run") or (runs[0] if runs else None)
        shown = await store.training_steps(run, MAX_STEPS) if run else []
        charts = training_charts(shown)
        return self._page(
            "training.html",
            runs=runs,
            run=run,
            steps=list(reversed(shown)),
            charts=charts,
            moves=await store.alias_moves(limit=MAX_MOVES),
            aliases=await store.aliases(),
        )

    async def production(self, request: web.Request) -> web.Response:
        """Each alias's newest canary: its arms, the interval as it narrowed, the decision and
        its evidence; the alias's moves with theirs."""
        store = self._store_of(request)
        canaries = []
        for alias in await store.aliases():
            history = await store.alias_moves(alias.alias, limit=MAX_MOVES)
            stages = _canary_stages(history)
            if not stages:
                continue
            running = alias.canary == stages[0].model and alias.canary_since is not None
            looks = await store.canary_looks(alias.alias, since=stages[0].moved_at, limit=MAX_LOOKS)
            looks.reverse()
            canaries.append(
                CanaryView(
                    alias, stages[0], running, looks, canary_chart(looks), history, len(stages)
                )
            )
        return self._page("production.html", canaries=canaries)

    async def evaluations(self, request: web.Request) -> web.Response:
        """`art-proxy eval`'s reports, newest first, each as the command printed it."""
        reports = await self._store_of(request).evaluations(MAX_EVALUATIONS)
        placeholders = self._placeholders(request)
        if placeholders is not None:
            reports = [redacted_evaluation(report, placeholders) for report in reports]
        shown = [
            (title(r), headers(r), rows(r), notes(r), r.created_at, evaluation_chart(r))
            for r in reports
        ]
        return self._page("evaluations.html", evaluations=shown)

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:
            return self._not_found(f"No file {name!r}.")
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=STATIC_FILES[name], charset="utf-8")

    def _page(self, template: str, *, status: int = 200, **context: Any) -> web.Response:
        html = self._templates.get_template(template).render(**context)
        return web.Response(text=html, status=status, content_type="text/html")

    def _not_found(self, message: str) -> web.Response:
        return self._page("not_found.html", status=404, message=message)


def add_routes(
    router: web.UrlDispatcher, store_of: StoreOf, redactor_of: RedactorOf = lambda _: None
) -> None:
    """Register the dashboard under /dashboard; `store_of` finds the store of a request's app,
    `redactor_of` its redactor of personal data, if it has one."""
    dashboard = Dashboard(store_of, redactor_of)
    router.add_get("/dashboard", dashboard.overview)
    router.add_get("/dashboard/", dashboard.overview)
    router.add_get("/dashboard/groups/{group}", dashboard.group)
    router.add_get("/dashboard/trajectories/{trajectory}", dashboard.trajectory)
    router.add_get("/dashboard/training", dashboard.training)
    router.add_get("/dashboard/production", dashboard.production)
    router.add_get("/dashboard/evaluations", dashboard.evaluations)
    router.add_get("/dashboard/static/{name}", dashboard.static)


def _canary_stages(history: Sequence[AliasMove]) -> list[AliasMove]:
    """The `canary` moves of the newest canary in an alias's `history` (newest first), oldest
    first: the one that began it, then each widening."""
    newest = next((i for i, move in enumerate(history) if move.reason == "canary"), None)
    if newest is None:
        return []
    stages = [history[newest]]
    for move in history[newest + 1 :]:
        if move.reason != "canary" or move.model != stages[0].model:
            break
        stages.append(move)
    return stages[::-1]


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__ or "art_proxy.dashboard", "templates"),
        autoescape=True,  # the escaping guarantee: every value is text unless marked otherwise
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        {
            "when": _when,
            "number": _number,
            "segment": _segment,
            "opening": _opening,
            "outcomes": _outcomes,
        }
    )
    return environment


def _group_filter(query: Mapping[str, str]) -> GroupFilter:
    """Filters from the address; a value the page never offers is ignored, not an error."""
    split = query.get("split")
    status = query.get("status")
    try:
        offset = max(int(query.get("offset", "0")), 0)
    except ValueError:
        offset = 0
    return GroupFilter(
        split=next((s for s in SPLITS if s == split), None),
        status=next((s for s in GROUP_STATUSES if s == status), None),
        scenario=query.get("scenario") or None,
        user=query.get("user") or None,
        tenant=query.get("tenant") or None,
        limit=PAGE_SIZE,
        offset=offset,
    )


def _redacted_summary(group: GroupSummary, placeholders: Placeholders) -> GroupSummary:
    return replace(
        group,
        opening=placeholders.value(group.opening),
        judge_reason=placeholders.value(group.judge_reason),
    )


def _page_link(where: GroupFilter, offset: int) -> str:
    """The overview's address for another page under the same filters."""
    filters = {
        "split": where.split,
        "status": where.status,
        "scenario": where.scenario,
        "user": where.user,
        "tenant": where.tenant,
    }
    query = {name: value for name, value in filters.items() if value is not None}
    return "/dashboard?" + urlencode({**query, "offset": offset})


def _in_judged_order(
    members: Sequence[TrajectoryRecord], judgment: Judgment | None
) -> list[TrajectoryRecord]:
    """The order the judge saw them in (t1, t2...), members it did not see after, oldest first."""
    if judgment is None:
        return list(members)
    position = {trajectory_id: i for i, trajectory_id in enumerate(judgment.trajectory_ids)}
    return sorted(members, key=lambda member: position.get(member.id, len(position)))


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _segment(value: str) -> str:
    """A value as one path segment of a link (a scenario id may hold a slash)."""
    return quote(value, safe="")


def _opening(messages: Sequence[JsonObject], limit: int = 160) -> str:
    """What a scenario asks: the last message of its opening with text, on one line."""
    for message in reversed(messages):
        text = " ".join(message_view(message).text.split())
        if text:
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""


def _outcomes(groups: Mapping[str, GroupOutcome]) -> list[tuple[GroupOutcome, int]]:
    """What a step did with its groups: outcome -> how many, most common first."""
    return Counter(groups.values()).most_common()
