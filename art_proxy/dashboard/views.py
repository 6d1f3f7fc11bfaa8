"""The dashboard's pages: groups, one group side by side, one trajectory's raw calls, training,
evaluations.

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
    redacted_judgment,
    redacted_trajectory,
)
from art_proxy.records import (
    AGENT_METRIC_PREFIX,
    SPLITS,
    CallRecord,
    GroupOutcome,
    JsonObject,
    Judgment,
    TrainingStep,
    TrajectoryRecord,
    TrajectoryScore,
)
from art_proxy.store.dashboard import GROUP_STATUSES, DashboardQueries, GroupFilter, GroupSummary
from art_proxy.store.trajectory_store import TrajectoryStore

from .plots import Chart, Series, line_chart
from .render import MessageView, call_view, conversation, message_view, shared_prefix

StoreOf = Callable[[web.Request], TrajectoryStore]
RedactorOf = Callable[[web.Request], PiiRedactor | None]

PAGE_SIZE = 50
STATIC_FILES = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}
# Steps of a run plotted: more points than a chart is wide are not readable anyway.
MAX_STEPS = 2000
MAX_MOVES = 200
MAX_EVALUATIONS = 20


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
        reward = _reward_chart(await store.training_steps(run, MAX_STEPS)) if run else None
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
        if placeholders is not None:
            found = redacted_trajectory(found, placeholders)
        calls = found.calls or []
        return self._page(
            "trajectory.html",
            trajectory=found,
            messages=conversation(calls),
            calls=[call_view(call) for call in calls],
        )

    async def training(self, request: web.Request) -> web.Response:
        store = self._store_of(request)
        runs = await DashboardQueries(store.engine).runs()
        run = request.query.get("run") or (runs[0] if runs else None)
        shown = await store.training_steps(run, MAX_STEPS) if run else []
        charts: list[tuple[str, Chart | None]] = [
            ("reward", _reward_chart(shown)),
            ("loss", _loss_chart(shown)),
            ("agent-metrics", _agent_chart(shown)),
            ("kl", _metric_chart(shown, "kl", "KL to the base model")),
            ("off-policy", _off_policy_chart(shown)),
            ("staleness", _staleness_chart(shown)),
            ("pipeline-wait", _pipeline_wait_chart(shown)),
            ("pipeline-ahead", _pipeline_ahead_chart(shown)),
        ]
        return self._page(
            "training.html",
            runs=runs,
            run=run,
            steps=list(reversed(shown)),
            charts=charts,
            moves=await store.alias_moves(limit=MAX_MOVES),
            aliases=await store.aliases(),
        )

    async def evaluations(self, request: web.Request) -> web.Response:
        """`art-proxy eval`'s reports, newest first, each as the command printed it."""
        reports = await self._store_of(request).evaluations(MAX_EVALUATIONS)
        shown = [(title(r), headers(r), rows(r), notes(r), r.created_at) for r in reports]
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
    router.add_get("/dashboard/evaluations", dashboard.evaluations)
    router.add_get("/dashboard/static/{name}", dashboard.static)


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


def _reward_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """Mean reward per step with its within-group spread as a band, and the validation reward."""
    trained = [step for step in steps if "reward_mean" in step.metrics]
    series = [
        Series(
            "reward mean",
            [(step.step, step.metrics["reward_mean"]) for step in trained],
            [step.metrics.get("reward_std", 0.0) for step in trained],
        ),
        _metric_series(steps, "val_reward", "validation reward"),
    ]
    # Rewards all in [0, 1] (RULER's, most agents'): the band stays in it.
    values = [value for one in series for _, value in one.points]
    unit = bool(values) and all(0.0 <= value <= 1.0 for value in values)
    return line_chart("Reward", series, floor=0.0 if unit else None, ceiling=1.0 if unit else None)


def _loss_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """GRPO's loss, and a warm start's (the demonstrations' negative log-likelihood per token:
    another quantity, so a series of its own)."""
    warm = [step for step in steps if step.kind == "sft"]
    grpo = [step for step in steps if step.kind == "grpo"]
    return line_chart(
        "Loss",
        [
            _metric_series(grpo, "loss", "GRPO loss"),
            _metric_series(warm, "loss", "warm start: demonstrations' NLL per token"),
        ],
    )


def _off_policy_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """How far the trained tokens were from the distribution they were scored with, and how much
    the objective had to correct: the sampler's numerics (bf16 serving) and stale adapters show
    here before they show in the reward."""
    return line_chart(
        "Off-policy: mismatch and correction",
        [
            _metric_series(steps, "mismatch", "mean |d logprob| sampler vs trainer"),
            _metric_series(steps, "is_capped", "tokens whose weight was capped"),
            _metric_series(steps, "clip_fraction", "tokens clipped (mean of the step's updates)"),
            _metric_series(steps, "clip_fraction_last", "tokens clipped in the step's last update"),
            _metric_series(steps, "update_drift_last", "|d logprob| the step's updates moved"),
        ],
    )


def _staleness_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    return line_chart(
        "Staleness: steps between the sampling adapter and the trained one",
        [
            _metric_series(steps, "staleness_mean", "mean"),
            _metric_series(steps, "staleness_max", "max"),
        ],
        floor=0.0,
    )


def _pipeline_wait_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """The overlapped loop (--max-off-policy-steps): who waited for whom. Absent for an
    alternating run (no step carries the metrics)."""
    return line_chart(
        "Pipeline: seconds waited",
        [
            _metric_series(steps, "pipeline_trainer_wait_s", "the trainer, for its batch"),
            _metric_series(steps, "pipeline_admission_wait_s", "the rollouts, for admission"),
        ],
        floor=0.0,
    )


def _pipeline_ahead_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    return line_chart(
        "Pipeline: how far the rollouts ran ahead",
        [
            _metric_series(steps, "pipeline_lag_steps", "steps since the batch's rollouts began"),
            _metric_series(steps, "pipeline_queue_depth", "batches ready when one was taken"),
        ],
        floor=0.0,
    )


def _agent_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """What the agent reported of its training rollouts (tool calls, turns...), a mean per step."""
    names = sorted({m for step in steps for m in step.metrics if m.startswith(AGENT_METRIC_PREFIX)})
    series = [_metric_series(steps, name, name.removeprefix(AGENT_METRIC_PREFIX)) for name in names]
    return line_chart("Agent metrics (mean per training rollout)", series)


def _metric_chart(steps: Sequence[TrainingStep], metric: str, title: str) -> Chart | None:
    return line_chart(title, [_metric_series(steps, metric, metric)])


def _metric_series(steps: Sequence[TrainingStep], metric: str, name: str) -> Series:
    return Series(
        name, [(step.step, step.metrics[metric]) for step in steps if metric in step.metrics]
    )


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
