"""From an evaluation's rollouts to its report: each arm's reward with a 95% interval, its paired
difference to the reference arm, latency, tokens and cost; printed as a table, written as
Markdown, JSON and a chart.

A rollout whose agent raised or timed out counts as reward 0: a model that breaks the agent is
worse, not absent. The cost of an arm is litellm's price of its model where the table knows it,
else `--price LABEL=USD_PER_HOUR` spread over the rollouts the arm completed in its wall time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich import box
from rich.table import Table

from art_proxy.evaluation.arms import ArmSpec
from art_proxy.evaluation.intervals import mean_interval, paired_difference, percentile
from art_proxy.privacy.redaction import REDACTED, scrub_text
from art_proxy.records.evaluations import ArmResult, EvaluationReport, ScoredBy
from art_proxy.rollout import GroupReport
from art_proxy.ruler.judge import litellm_module

log = logging.getLogger(__name__)

FAILED_REWARD = 0.0


@dataclass
class ArmRun:
    """What one arm's rollouts left: its groups (one a scenario), tokens by trajectory."""

    spec: ArmSpec
    model: str  # the name its calls sent
    served_by: str
    proxy_url: str = ""  # the recording proxy its calls go through
    groups: list[GroupReport] = field(default_factory=list)
    seconds: float = 0.0  # the arm's wall time
    error: str | None = None  # why the arm did not run
    tokens: dict[str, tuple[int, int]] = field(default_factory=dict)  # prompt, completion
    # The keys its calls could meet (its own server's, the proxy's): a server's 401 may quote
    # one back, in whatever shape it has; never in the report.
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prices:
    per_token: Mapping[str, tuple[float, float]]  # label -> (input, output) dollars a token
    per_hour: Mapping[str, float]  # label -> dollars an hour of a self-hosted server


def build_report(
    runs: Sequence[ArmRun],
    rewards: Mapping[str, float],
    *,
    evaluation_id: str,
    agent: str,
    repeats: int,
    reference: str,
    reward_source: ScoredBy,
    judge: str | None,
    prices: Prices,
    interrupted: bool = False,
) -> EvaluationReport:
    """The report of `runs`, whose rollouts are scored by `rewards` (trajectory -> reward)."""
    by_scenario = {run.spec.label: _rewards_by_scenario(run, rewards) for run in runs}
    arms = [
        _arm_result(
            run,
            by_scenario[run.spec.label],
            None if run.spec.label == reference else by_scenario.get(reference),
            prices,
        )
        for run in runs
    ]
    scenarios = {group.scenario_id for run in runs for group in run.groups}
    return EvaluationReport(
        id=evaluation_id,
        created_at=datetime.now(UTC),
        agent=agent,
        scenarios=len(scenarios),
        repeats=repeats,
        reward_source=reward_source,
        judge=judge,
        reference=reference,
        interrupted=interrupted,
        arms=arms,
    )


def _rewards_by_scenario(run: ArmRun, rewards: Mapping[str, float]) -> dict[str, list[float]]:
    """Each scenario's rewards under the arm; a failed rollout scores FAILED_REWARD, one that
    ended without a reward (no judge could score it) is left out."""
    found: dict[str, list[float]] = {}
    for group in run.groups:
        for trajectory in group.trajectory_ids:
            if trajectory in group.errors:
                reward: float | None = FAILED_REWARD
            elif trajectory in group.seconds:
                reward = rewards.get(trajectory)
            else:
                reward = None  # never ended: cut by an interruption
            if reward is not None:
                found.setdefault(group.scenario_id, []).append(reward)
    return found


def _arm_result(
    run: ArmRun,
    by_scenario: dict[str, list[float]],
    reference: dict[str, list[float]] | None,
    prices: Prices,
) -> ArmResult:
    ended = [t for g in run.groups for t in g.trajectory_ids if t in g.seconds]
    failures = [g.errors[t] for g in run.groups for t in g.trajectory_ids if t in g.errors]
    seconds = [g.seconds[t] for g in run.groups for t in g.trajectory_ids if t in g.seconds]
    counted = [run.tokens[t] for t in ended if t in run.tokens]
    prompt = sum(p for p, _ in counted) / len(counted) if counted else None
    completion = sum(c for _, c in counted) / len(counted) if counted else None
    cost, basis = _cost(run, prompt, completion, len(ended), prices)
    return ArmResult(
        label=run.spec.label,
        model=run.model,
        served_by=run.served_by,
        rollouts=len(ended),
        failed=len(failures),
        # stored and shown on the dashboard: held to the rule of what the proxy records
        error=_scrubbed(run.error or (failures[0] if failures else None), run.secrets),
        reward=mean_interval([r for rs in by_scenario.values() for r in rs]),
        difference=None if reference is None else paired_difference(by_scenario, reference),
        latency_p50_s=percentile(seconds, 0.5) if seconds else None,
        latency_p95_s=percentile(seconds, 0.95) if seconds else None,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_per_1000=cost,
        cost_basis=basis,
    )


def _cost(
    run: ArmRun, prompt: float | None, completion: float | None, ended: int, prices: Prices
) -> tuple[float | None, str | None]:
    label = run.spec.label
    if label in prices.per_hour:
        if not ended or run.seconds <= 0:
            return None, None
        per_hour = prices.per_hour[label]
        rollouts_an_hour = ended / run.seconds * 3600
        return (
            per_hour / rollouts_an_hour * 1000,
            f"${per_hour:g}/h at {rollouts_an_hour:,.0f} rollouts/h",
        )
    if label in prices.per_token and prompt is not None and completion is not None:
        into, out = prices.per_token[label]
        return (prompt * into + completion * out) * 1000, "litellm's price table"
    return None, None


def litellm_prices(specs: Sequence[ArmSpec]) -> dict[str, tuple[float, float]]:
    """Dollars a prompt and a completion token of each arm whose model litellm's table prices."""
    litellm = litellm_module()  # imported here, when an arm may be priced
    found = {}
    for spec in specs:
        entry = litellm.model_cost.get(spec.priced_as or "") if spec.priced_as else None
        if entry and "input_cost_per_token" in entry and "output_cost_per_token" in entry:
            found[spec.label] = (
                float(entry["input_cost_per_token"]),
                float(entry["output_cost_per_token"]),
            )
    return found


_COLUMNS = ("arm", "model", "reward [95%]", "vs {ref} [95%]", "rollouts", "failed")
_MORE = ("p50 s", "p95 s", "prompt tok", "completion tok", "$ / 1k rollouts")


def rows(report: EvaluationReport) -> list[list[str]]:
    rows = []
    for arm in report.arms:
        rows.append(
            [
                arm.label,
                arm.model,
                str(arm.reward),
                "reference" if arm.difference is None else arm.difference.signed(),
                str(arm.rollouts),
                str(arm.failed),
                _number(arm.latency_p50_s, "{:.1f}"),
                _number(arm.latency_p95_s, "{:.1f}"),
                _number(arm.prompt_tokens, "{:,.0f}"),
                _number(arm.completion_tokens, "{:,.0f}"),
                _number(arm.cost_per_1000, "{:,.2f}"),
            ]
        )
    return rows


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def headers(report: EvaluationReport) -> list[str]:
    return [c.format(ref=report.reference) for c in _COLUMNS] + list(_MORE)


def title(report: EvaluationReport) -> str:
    source = f"judged by {report.judge}" if report.reward_source == "judge" else "agent's reward"
    cut = ", interrupted: partial" if report.interrupted else ""
    if not report.scenarios:  # no arm ran a rollout: there is nothing to count
        return f"evaluation {report.id}: no arm ran, nothing measured"
    return f"evaluation {report.id}: {report.scenarios} scenarios x {report.repeats}, {source}{cut}"


# The terminal's table: the columns that answer "is it better", under short names, narrow
# enough for 80 columns (the model, p95 and tokens are in report.md and report.json).
_SHOWN = {0: "arm", 2: "reward [95%]", 3: "vs {ref}", 4: "n", 5: "failed", 6: "p50 s", 10: "$/1k"}


def verdicts(report: EvaluationReport) -> list[str]:
    """One plain line per arm compared with the reference: better, worse, or no measurable
    difference, and why not where both arms never once scored."""
    reference = next((arm for arm in report.arms if arm.label == report.reference), None)
    lines = []
    for arm in report.arms:
        found = arm.difference
        if reference is None or found is None or found.low is None or found.high is None:
            continue
        versus = f"{arm.label} against {reference.label}: {found.signed()}"
        if found.low > 0:
            lines.append(f"{versus}, better")
        elif found.high < 0:
            lines.append(f"{versus}, worse")
        elif arm.reward.mean == 0 and reference.reward.mean == 0:
            lines.append(
                f"{versus}, no measurable difference: neither arm scored above 0 in "
                f"{arm.reward.n} and {reference.reward.n} rollouts. The model does not do this "
                "task yet, so training on its own attempts had nothing to reinforce: a stronger "
                "base model, a teacher that does the task (docs/training.md), or an easier task"
            )
        else:
            lines.append(
                f"{versus}, no measurable difference at this size (more --repeats or scenarios "
                "narrow the interval)"
            )
    return lines


def table(report: EvaluationReport) -> Table:
    # One space between columns, none at the edges: the intervals are long, and with rich's
    # default padding 80 columns cut "failed" to "fai…".
    heading = title(report)
    shown = Table(
        title=heading,
        min_width=len(heading),  # a title is wrapped to its table's width
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    for index, name in _SHOWN.items():
        shown.add_column(
            name.format(ref=report.reference),
            no_wrap=index in (0, 2, 3),
            justify="left" if index == 0 else "right",
        )
    for row in rows(report):
        shown.add_row(*(row[index] for index in _SHOWN))
    return shown


def markdown(report: EvaluationReport) -> str:
    columns = headers(report)
    lines = [
        f"# {title(report)}",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(report)]
    lines += ["", *notes(report)]
    return "\n".join(lines) + "\n"


def notes(report: EvaluationReport) -> list[str]:
    notes = [
        "Reward: mean over rollouts (a failed rollout scores 0), 95% interval (Wilson for "
        "0/1 rewards, else bootstrap). The difference is paired by scenario (bootstrap over "
        "scenarios). Latency: seconds a rollout took.",
    ]
    for arm in report.arms:
        if arm.cost_basis:
            notes.append(f"- {arm.label}: cost from {arm.cost_basis}.")
        if arm.error and not arm.rollouts:
            notes.append(f"- {arm.label} did not run: {arm.error}")
        elif arm.error:
            notes.append(f"- {arm.label}: {arm.failed} rollouts failed, the first: {arm.error}")
    return notes


def write(report: EvaluationReport, out: Path) -> list[Path]:
    """report.json, report.md and, with matplotlib, report.png in `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json", out / "report.md"]
    written[0].write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    written[1].write_text(markdown(report), encoding="utf-8")
    chart = _chart(report, out / "report.png")
    return [*written, chart] if chart is not None else written


def _scrubbed(error: str | None, secrets: Sequence[str] = ()) -> str | None:
    if error is None:
        return None
    for secret in secrets:
        error = error.replace(secret, REDACTED)
    return scrub_text(error)


def _error_bar(arm: ArmResult) -> tuple[float, float]:
    """How far the interval reaches below and above the mean (never negative)."""
    mean, low, high = arm.reward.mean or 0.0, arm.reward.low or 0.0, arm.reward.high or 0.0
    return max(0.0, mean - low), max(0.0, high - mean)


def _chart(report: EvaluationReport, path: Path) -> Path | None:
    """Reward with its interval per arm and, where costs are known, reward against cost."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no chart: matplotlib is not installed (pip install 'art-proxy[examples]')")
        return None
    shown = [a for a in report.arms if a.reward.mean is not None]
    priced = [a for a in shown if a.cost_per_1000 is not None]
    figure, axes = plt.subplots(1, 2 if priced else 1, figsize=(10 if priced else 5.5, 3.8))
    bars = axes[0] if priced else axes
    means = [a.reward.mean or 0.0 for a in shown]
    errors = [_error_bar(a) for a in shown]
    bars.bar(
        [a.label for a in shown],
        means,
        yerr=[[below for below, _ in errors], [above for _, above in errors]],
        capsize=4,
        color="#4c72b0",
    )
    bars.set_ylabel("reward (95% interval)")
    bars.set_title(f"{report.scenarios} scenarios x {report.repeats}")
    if priced:
        costs = axes[1]
        for arm in priced:
            below, above = _error_bar(arm)
            costs.errorbar(
                arm.cost_per_1000, arm.reward.mean, yerr=[[below], [above]], fmt="o", capsize=4
            )
            costs.annotate(arm.label, (arm.cost_per_1000 or 0, arm.reward.mean or 0))
        costs.set_xlabel("$ per 1,000 rollouts")
        costs.set_ylabel("reward")
        costs.set_title("reward against cost")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
