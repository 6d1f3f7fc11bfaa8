"""`art-proxy eval`: arms side by side on held-out scenarios, recorded apart, never trained on.

Two fake vLLMs stand for two models: the proxy's upstream answers "no" (the base arm), a server of
its own answers "yes" (an arm named NAME@URL, as a hosted model is). The agent's reward is 1 for
"yes": the report must tell them apart by exactly that.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web
from rich.console import Console

from art_proxy.config import EvalSettings
from art_proxy.errors import ConfigError
from art_proxy.evaluation.arms import parse_arm
from art_proxy.evaluation.intervals import bootstrap_mean, mean_interval, paired_difference, wilson
from art_proxy.evaluation.report import title, verdicts
from art_proxy.evaluation.run import run_evaluation
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import ArmResult, Estimate, EvaluationReport, TrainingStep
from art_proxy.rollout import Rollout
from art_proxy.scenarios import Scenario
from art_proxy.store import schema
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from art_proxy.testing.loopback import serving
from tests.conftest import proxy_settings
from tests.ruler.scripted_judge import answer_by_content, running_scripted_judge
from tests.test_aliases import load_adapter, put_alias

SCENARIOS = [
    Scenario.model_validate({"id": f"q{i}", "input": f"question {i}", "split": "val"})
    for i in range(3)
]


async def _reply(rollout: Rollout) -> str:
    async with rollout.openai_client() as client:
        answer = await client.chat.completions.create(
            model=rollout.model, messages=[{"role": "user", "content": str(rollout.scenario.input)}]
        )
    return answer.choices[0].message.content or ""


async def says_yes(rollout: Rollout) -> float:
    return 1.0 if "yes" in await _reply(rollout) else 0.0


async def no_reward(rollout: Rollout) -> None:
    await _reply(rollout)


@pytest.fixture
async def two_models(sqlite_url: str) -> AsyncIterator[tuple[RunningProxy, FakeVllm]]:
    """The proxy in front of a model that answers no; a model of its own that answers yes."""
    async with (
        running_fake_vllm(FakeVllmConfig(reply="no")) as upstream,
        running_fake_vllm(FakeVllmConfig(reply="yes", model="hosted")) as other,
        running_proxy(proxy_settings(sqlite_url, upstream.base_url)) as proxy,
    ):
        yield proxy, other


def _settings(proxy: RunningProxy, tmp_path: Path, **more: Any) -> EvalSettings:
    return EvalSettings.model_validate(
        {
            "store": proxy.parts.settings.store,
            "proxy": proxy.root_url,
            "agent": "unused:unused",
            "scenarios": "unused.jsonl",
            "repeats": 4,
            "out": str(tmp_path / "eval"),
            **more,
        }
    )


# --- intervals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    # Wilson's 95% score interval, as statsmodels' proportion_confint(method="wilson") gives it.
    [
        (8, 10, 0.4902, 0.9433),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (45, 100, 0.3560, 0.5475),
    ],
)
def test_wilson_interval_against_known_values(
    successes: int, n: int, low: float, high: float
) -> None:
    estimate = wilson(successes, n)
    assert estimate.mean == successes / n and estimate.method == "wilson"
    assert estimate.low == pytest.approx(low, abs=5e-4)
    assert estimate.high == pytest.approx(high, abs=5e-4)


def test_the_bootstrap_is_seeded_and_near_the_normal_interval_of_a_mean() -> None:
    values = [((i * 37) % 101) / 100 for i in range(200)]  # spread over [0, 1], not 0/1
    first, again = bootstrap_mean(values, seed=3), bootstrap_mean(values, seed=3)
    assert first == again  # the same rewards, the same interval
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    assert first.mean is not None and first.mean == pytest.approx(statistics.fmean(values))
    assert first.low == pytest.approx(first.mean - half, abs=0.01)
    assert first.high == pytest.approx(first.mean + half, abs=0.01)
    constant = bootstrap_mean([0.5] * 20)
    assert (constant.low, constant.high) == (0.5, 0.5)


def test_a_paired_difference_resamples_scenarios_and_removes_their_spread() -> None:
    # Scenario difficulty varies widely, but the arm beats the reference by 0.1 on every one.
    reference = {f"s{i}": [i / 10] for i in range(9)}
    arm = {f"s{i}": [i / 10 + 0.1] for i in range(9)}
    difference = paired_difference(arm, reference)
    assert difference.n == 9 and difference.method == "bootstrap"
    assert difference.mean == pytest.approx(0.1)
    assert difference.low == pytest.approx(0.1) and difference.high == pytest.approx(0.1)


def test_arms_that_never_succeed_differ_by_an_interval_not_a_point_and_the_verdict_says_why() -> (
    None
):
    """A pydantic-ai agent the bundled model could not help: base 0/16, trained 0/16, and the
    paired bootstrap said +0.00 [+0.00, +0.00], which 16 rollouts an arm cannot support."""
    zeros = {f"s{i}": [0.0] * 4 for i in range(4)}
    difference = paired_difference(zeros, zeros)
    assert difference.method == "newcombe" and difference.n == 4 and difference.mean == 0
    bound = wilson(0, 16).high
    assert bound is not None and 0.19 < bound < 0.2
    assert difference.low == pytest.approx(-bound) and difference.high == pytest.approx(bound)
    # Some spread sampled: the paired bootstrap as before.
    assert paired_difference({"s0": [1.0], "s1": [0.0]}, {"s0": [0.0], "s1": [0.0]}).method == (
        "bootstrap"
    )

    def arm(label: str, rewards: list[float], vs: dict[str, list[float]] | None) -> ArmResult:
        return ArmResult(
            label=label, model=label, served_by="proxy", rollouts=len(rewards), failed=0,
            reward=mean_interval(rewards),
            difference=None if vs is None else paired_difference({"s0": rewards}, vs),
            latency_p50_s=None, latency_p95_s=None, prompt_tokens=None, completion_tokens=None,
            cost_per_1000=None,
        )  # fmt: skip

    def report(*arms: ArmResult) -> EvaluationReport:
        return EvaluationReport(
            id="e", created_at=datetime.now(UTC), agent="a", scenarios=1, repeats=16,
            reward_source="agent", reference="base", arms=list(arms),
        )  # fmt: skip

    base = [0.0] * 16
    [never] = verdicts(report(arm("base", base, None), arm("trained", base, {"s0": base})))
    assert never.startswith("trained against base: +0.00 [-0.19, +0.19], no measurable difference")
    assert "neither arm scored above 0 in 16 and 16 rollouts" in never
    better = [1.0] * 15 + [0.0]
    [found] = verdicts(report(arm("base", base, None), arm("trained", better, {"s0": base})))
    assert found.startswith("trained against base: +0.94 [") and found.endswith(", better")


@pytest.mark.parametrize(
    ("text", "label", "model", "upstream"),
    [
        ("base", "base", "base", None),
        ("policy@8", "policy@8", "policy@8", None),
        ("trained=policy@8", "trained", "policy@8", None),
        ("openai/gpt-4.1", "openai/gpt-4.1", "gpt-4.1", "https://api.openai.com/v1"),
        ("demo=demo@http://127.0.0.1:8400/v1/", "demo", "demo", "http://127.0.0.1:8400/v1"),
        ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B", None),
    ],
)
def test_an_arm_is_named_as_the_judge_names_its_model(
    text: str, label: str, model: str, upstream: str | None
) -> None:
    arm = parse_arm(text)
    assert (arm.label, arm.model, arm.upstream) == (label, model, upstream)


# --- the run ---------------------------------------------------------------------------------


async def test_arms_side_by_side_report_success_intervals_and_the_paired_difference(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    proxy, other = two_models
    settings = _settings(proxy, tmp_path, model=["base", f"hosted@{other.base_url}"])
    report = await run_evaluation(settings, says_yes, SCENARIOS)
    base, hosted = report.arms
    assert (base.label, base.model, base.served_by) == ("base", FakeVllmConfig().model, "proxy")
    assert (hosted.label, hosted.served_by) == ("hosted", other.base_url)
    assert (base.rollouts, hosted.rollouts, base.failed, hosted.failed) == (12, 12, 0, 0)
    assert str(base.reward) == "0.00 [0.00, 0.24]"  # Wilson, 0 of 12
    assert str(hosted.reward) == "1.00 [0.76, 1.00]"
    # 12 of 12 against 0 of 12: every scenario differs by 1, which 12 rollouts an arm cannot make
    # certain (the bootstrap said [+1.00, +1.00]); Newcombe's interval from the two Wilsons.
    assert hosted.difference is not None and hosted.difference.signed() == "+1.00 [+0.66, +1.00]"
    assert base.difference is None and report.reference == "base"
    assert report.reward_source == "agent" and (report.scenarios, report.repeats) == (3, 4)
    assert base.latency_p50_s is not None and base.latency_p95_s is not None
    assert base.prompt_tokens and base.completion_tokens  # read off the recorded calls


async def test_an_evaluation_is_recorded_apart_and_never_judged_or_trained_on(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    proxy, other = two_models
    settings = _settings(proxy, tmp_path, model=["base", f"hosted@{other.base_url}"])
    await run_evaluation(settings, says_yes, SCENARIOS)
    await proxy.parts.settled()
    async with TrajectoryStore.opened(proxy.parts.settings.store, writer=False) as store:
        recorded = await store.trajectories(limit=100)
        assert len(recorded) == 24 and {t.split for t in recorded} == {"eval"}
        by_group: dict[str, set[str]] = {}
        for trajectory in recorded:
            by_group.setdefault(trajectory.group_id, set()).add(trajectory.upstream)
        assert len(by_group) == 3  # one group a scenario, both arms in it
        assert all(len(upstreams) == 2 for upstreams in by_group.values())
        unjudged = await store.unjudged_groups(judge_model="j", mode="json", rubric_hash="r")
        assert unjudged == []
        for source in ("finish", "judgment", "teacher"):
            assert await store.trainable_groups("run", source=source) == []
        (stored,) = await store.evaluations()
    assert [arm.label for arm in stored.arms] == ["base", "hosted"]
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.root_url}/dashboard/evaluations") as page,
    ):
        html = await page.text()
    assert page.status == 200 and "vs base [95%]" in html
    assert "<td>hosted</td>" in html and "+1.00 [+0.66, +1.00]" in html
    # The arms drawn side by side (report.png's chart, which the page once left out).
    [chart] = re.findall(
        r'<svg [^>]*aria-label="Reward by arm \(95% interval\)".*?</svg>', html, re.S
    )
    assert "<title>base: 0 [0, " in chart and "<title>hosted: 1 [" in chart
    assert ">reward</text>" in chart
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.root_url}/dashboard?split=eval") as page,
    ):
        listed = await page.text()
    assert page.status == 200 and listed.count('href="/dashboard/groups/') == 3  # shown apart


async def test_without_a_reward_the_judge_ranks_each_scenarios_arms_together_unnamed(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    proxy, other = two_models
    async with running_scripted_judge(
        answer_by_content(lambda text: float("yes" in text))
    ) as judge:
        settings = _settings(
            proxy,
            tmp_path,
            model=["base", f"hosted@{other.base_url}"],
            judge=["openai/judge"],
            judge_base_url=[judge.base_url],
            repeats=2,
        )
        report = await run_evaluation(settings, no_reward, SCENARIOS)
    base, hosted = report.arms
    assert report.reward_source == "judge" and report.judge == "openai/judge"
    assert str(base.reward) == "0.00 [0.00, 0.39]" and str(hosted.reward) == "1.00 [0.61, 1.00]"
    prompts = [judge.prompt(i) for i in range(len(judge.requests))]
    judged = [p for p in prompts if "<trajectory" in p]
    assert len(judged) == 3 * 2  # each scenario's group of 4, in 2 orders
    for prompt in judged:
        assert prompt.count("<trajectory") == 4
        assert "hosted" not in prompt and other.base_url not in prompt


async def test_an_arm_that_cannot_run_is_reported_and_the_others_go_on(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    proxy, _ = two_models
    settings = _settings(
        proxy,
        tmp_path,
        model=["base", "gone=m@http://127.0.0.1:9/v1", "missing=policy@7"],
        repeats=1,
    )
    report = await run_evaluation(settings, says_yes, SCENARIOS)
    base, gone, missing = report.arms
    assert base.rollouts == 3 and base.error is None
    assert gone.rollouts == 0 and gone.error == (
        "its models could not be listed: HTTP 502: upstream http://127.0.0.1:9/v1 refused the "
        "connection: [Errno 111] Connect call failed ('127.0.0.1', 9)"
    )
    assert missing.rollouts == 0 and "'policy@7' is not served there" in (missing.error or "")
    assert missing.reward.n == 0 and str(missing.reward) == "-"


async def leaks_a_key(rollout: Rollout) -> float:
    await _reply(rollout)
    raise RuntimeError("tool refused key sk-proj-abcdefghijklmnopqrstuvwxyz0123456789")


async def test_a_rollouts_error_reaches_the_report_without_the_secrets_it_held(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    """The report is stored and shown on the dashboard: an agent's exception text is held to
    the same rule as the calls the proxy records (secrets redacted)."""
    proxy, _ = two_models
    report = await run_evaluation(
        _settings(proxy, tmp_path, model=["base"], repeats=1), leaks_a_key, SCENARIOS
    )
    (base,) = report.arms
    assert base.failed == 3 and base.error is not None
    assert "RuntimeError: tool refused key" in base.error and "sk-proj-abc" not in base.error
    async with TrajectoryStore.opened(proxy.parts.settings.store, writer=False) as store:
        (stored,) = await store.evaluations()
    assert "sk-proj-abc" not in json.dumps(stored.model_dump(mode="json"))


async def test_an_arm_whose_server_counts_no_tokens_shows_none_not_zero(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    """A server that answers without usage or token ids (some hosted and self-hosted APIs):
    its tokens are unknown, shown as "-", not counted as spending nothing."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "quiet", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        message = {"role": "assistant", "content": "yes"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        reply = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"]}
        return web.json_response(reply | {"choices": [choice]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    proxy, _ = two_models
    async with serving(app) as quiet:
        settings = _settings(proxy, tmp_path, model=["base", f"quiet@{quiet}/v1"], repeats=1)
        report = await run_evaluation(settings, says_yes, SCENARIOS)
    base, unknown = report.arms
    assert base.prompt_tokens is not None
    assert unknown.rollouts == 3 and unknown.reward.mean == 1.0
    assert unknown.prompt_tokens is None and unknown.completion_tokens is None


async def test_stopping_reports_the_rollouts_that_ended(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(reply="yes", delay_s=0.2)) as upstream,
        running_proxy(proxy_settings(sqlite_url, upstream.base_url)) as proxy,
    ):
        stop = asyncio.Event()
        ended = 0

        def progress(_label: str, done: int, _total: int) -> None:
            nonlocal ended
            ended = done
            if done >= 2:
                stop.set()

        settings = _settings(proxy, tmp_path, model=["base"], repeats=10, concurrency=1)
        report = await run_evaluation(settings, says_yes, SCENARIOS, progress, stop)
    assert report.interrupted
    (base,) = report.arms
    assert 2 <= base.rollouts < 30 and base.reward.mean == 1.0


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"reference": "nope"}, "--reference 'nope' is none of the arms"),
        ({"price": ["nope=2"]}, "--price nope=...: no arm is labelled 'nope'"),
        ({"arm_api_key": ["nope=k"]}, "--arm-api-key nope=...: no arm is labelled 'nope'"),
        ({"model": ["m@http://u:secret@host/v1"]}, "carries credentials in its URL"),
    ],
)
def test_a_setting_that_cannot_work_is_refused_before_anything_runs(
    given: dict[str, Any], message: str
) -> None:
    settings = EvalSettings.model_validate(
        {"agent": "a:b", "scenarios": "s.jsonl", "model": ["base"], **given}
    )
    with pytest.raises(ConfigError, match=message) as refused:
        asyncio.run(run_evaluation(settings, says_yes, SCENARIOS))
    assert "secret" not in str(refused.value)


def test_the_report_is_written_as_json_markdown_and_a_chart(tmp_path: Path) -> None:
    from art_proxy.evaluation.report import table, write

    def arm(
        label: str, successes: int, difference: Estimate | None, cost: float | None
    ) -> ArmResult:
        return ArmResult(
            label=label,
            model=label,
            served_by="proxy",
            rollouts=120,
            failed=0,
            reward=wilson(successes, 120),
            difference=difference,
            latency_p50_s=1.5,
            latency_p95_s=3.0,
            prompt_tokens=900.0,
            completion_tokens=40.0,
            cost_per_1000=cost,
            cost_basis=None if cost is None else "$2/h at 4,000 rollouts/h",
        )

    gain = Estimate(mean=0.68, low=0.59, high=0.77, n=30, method="bootstrap")
    report = EvaluationReport(
        id="e1",
        created_at=datetime(2026, 11, 28, tzinfo=UTC),
        agent="agent.py:rollout",
        scenarios=30,
        repeats=4,
        reward_source="agent",
        reference="base",
        arms=[
            arm("base", 5, None, 0.5),
            arm("trained", 86, gain, 0.5),
            arm("hosted", 90, gain, None),
        ],
    )
    paths = write(report, tmp_path / "out")
    assert [p.name for p in paths] == ["report.json", "report.md", "report.png"]
    assert EvaluationReport.model_validate_json(paths[0].read_text()) == report
    markdown = paths[1].read_text()
    assert "| trained | trained | 0.72 [0.63, 0.79] | +0.68 [+0.59, +0.77] | 120 | 0 |" in markdown
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths[0].read_text())["arms"][0]["label"] == "base"
    # The terminal's table, at 80 columns: every header whole, each row on one line.
    terminal = Console(width=80, record=True, file=io.StringIO())
    terminal.print(table(report))
    shown = terminal.export_text()
    header = next(line for line in shown.splitlines() if "reward [95%]" in line)
    assert header.split() == [
        "arm",
        "reward",
        "[95%]",
        "vs",
        "base",
        "n",
        "failed",
        "p50",
        "s",
        "$/1k",
    ]
    assert any(
        line.split()[:2] == ["trained", "0.72"] and line.split()[-1] == "0.50"
        for line in shown.splitlines()
    )


def eval_command(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "eval", *args]
    wide = {**os.environ, "COLUMNS": "80"}  # a terminal's width
    return subprocess.run(
        command, capture_output=True, text=True, timeout=180, check=False, env=wide
    )


async def test_the_command_prints_the_table_and_writes_the_report(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    proxy, other = two_models
    scenarios = tmp_path / "scenarios.jsonl"
    scenarios.write_text("".join(s.model_dump_json() + "\n" for s in SCENARIOS))
    args = ["--agent", "tests.test_evaluation:says_yes", "--scenarios", str(scenarios)]
    args += ["--proxy", proxy.root_url, "--store", proxy.parts.settings.store]
    args += ["--model", "base", "--model", f"hosted@{other.base_url}", "--repeats", "2"]
    args += ["--price", "base=2", "--out", str(tmp_path / "report")]
    done = await asyncio.to_thread(eval_command, *args)
    assert done.returncode == 0, done.stderr
    assert "3 scenarios x 2, agent's reward" in done.stdout
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.strip().startswith(("base ", "hosted    "))]
    assert len(rows) == 2, done.stdout
    assert "0.00 [0.00, 0.39]" in rows[0] and "reference" in rows[0]
    assert "1.00 [0.61, 1.00]" in rows[1] and "+1.00 [+0.45, +1.00]" in rows[1]
    assert "hosted against base: +1.00 [+0.45, +1.00], better" in lines
    assert rows[0].split()[-1] != "-" and rows[1].split()[-1] == "-"  # priced by --price only
    assert max(len(line) for line in done.stdout.splitlines()) <= 80  # fits a terminal
    written = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert written == ["report.json", "report.md", "report.png"]
    # Piped, no bar shows: each arm's rollouts are counted in lines (it said nothing for 101 s).
    assert "arm base: rollouts: 6/6" in done.stderr and "arm hosted: rollouts: 6/6" in done.stderr
    said = " ".join(done.stderr.split())
    assert f"rollouts recorded in {proxy.parts.settings.store} (split eval" in said


def test_the_command_refuses_a_bad_arm_in_one_line(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios.jsonl"
    scenarios.write_text("".join(s.model_dump_json() + "\n" for s in SCENARIOS))
    args = ["--agent", "tests.test_evaluation:says_yes", "--scenarios", str(scenarios)]
    for arm, message in (
        ("=base", "error: --model '=base': the label before '='"),
        ("a=", "error: --model 'a=' names no model"),
    ):
        done = eval_command(*args, "--model", arm, "--store", f"sqlite:///{tmp_path / 'a.db'}")
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[0].startswith(message), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


async def test_the_base_arm_reaches_the_base_model_an_alias_of_its_name_hides(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The trainer names its alias after the base model, which then serves the adapter: the base
    arm goes to ALIAS@0, the base under the alias, and the alias's arm to the adapter."""
    async with (
        running_fake_vllm(FakeVllmConfig(reply="yes")) as upstream,
        running_proxy(proxy_settings(sqlite_url, upstream.base_url)) as proxy,
        aiohttp.ClientSession() as http,
    ):
        base = upstream.config.model
        await load_adapter(http, upstream, f"{base}@3-run", tmp_path)
        status, _ = await put_alias(http, proxy, {"model": f"{base}@3-run", "step": 3}, base)
        assert status == 200
        settings = _settings(proxy, tmp_path, model=["base", f"trained={base}@3"], repeats=1)
        report = await run_evaluation(settings, says_yes, SCENARIOS)
        served = [request["model"] for request in upstream.requests]
    assert [(arm.label, arm.model, arm.rollouts) for arm in report.arms] == [
        ("base", f"{base}@0", 3),
        ("trained", f"{base}@3-run", 3),
    ]
    assert sorted(served) == [base] * 3 + [f"{base}@3-run"] * 3


async def test_arms_name_the_adapter_they_measured_or_why_they_cannot(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`--model NAME@2` with step 2 of two runs answered "not served"; `trained`'s model column
    showed the alias, not the adapter it served; with no arm run, the title said "0 scenarios
    x 1"."""
    async with (
        running_fake_vllm(FakeVllmConfig(reply="yes")) as upstream,
        running_proxy(proxy_settings(sqlite_url, upstream.base_url)) as proxy,
        aiohttp.ClientSession() as http,
    ):
        base = upstream.config.model
        for run, tag in (("mine", "865f17"), ("theirs", "a2c69d")):
            await load_adapter(http, upstream, f"{base}@2-{tag}", tmp_path)
            await proxy.parts.store.record_step(
                TrainingStep(
                    run=run,
                    step=2,
                    status="applied",
                    adapter=f"{base}@2-{tag}",
                    groups={},
                    metrics={},
                    created_at=datetime.now(UTC),
                )
            )
        status, _ = await put_alias(http, proxy, {"model": f"{base}@2-a2c69d", "step": 2}, base)
        assert status == 200
        arms = ["trained", f"two={base}@2"]
        report = await run_evaluation(
            _settings(proxy, tmp_path, model=arms, repeats=1), says_yes, SCENARIOS
        )
        nothing = await run_evaluation(
            _settings(proxy, tmp_path, model=[f"two={base}@2"], repeats=1), says_yes, SCENARIOS
        )
    trained, two = report.arms
    assert (trained.model, trained.rollouts) == (f"{base}@2-a2c69d", 3)
    assert two.rollouts == 0 and two.error == (
        f"'{base}@2' is ambiguous: {base}@2-865f17 (run mine) or {base}@2-a2c69d (run theirs); "
        "name one"
    )
    assert title(nothing).endswith(": no arm ran, nothing measured")


async def test_an_arm_with_a_context_is_the_teacher_measured_before_it_teaches(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`--arm-context teacher=hint.txt`: that arm's prompts carry the hint where a teacher's
    --teacher-context goes (what OPD from it can reach); the other arm's do not."""
    hint = tmp_path / "hint.txt"
    hint.write_text("Answer yes.\n")
    async with (
        running_fake_vllm(FakeVllmConfig(reply="yes")) as upstream,
        running_proxy(proxy_settings(sqlite_url, upstream.base_url)) as proxy,
    ):
        arms = {"model": ["base", "teacher=base"], "arm_context": [f"teacher={hint}"]}
        report = await run_evaluation(
            _settings(proxy, tmp_path, **arms, repeats=1), says_yes, SCENARIOS
        )
        prompts = [json.dumps(request["messages"]) for request in upstream.requests]
    assert [arm.rollouts for arm in report.arms] == [3, 3]
    assert sum("Answer yes." in prompt for prompt in prompts) == 3
    with pytest.raises(ConfigError, match=r"--arm-context nobody=\.\.\.: no arm is labelled"):
        await run_evaluation(
            _settings(proxy, tmp_path, model=["base"], arm_context=["nobody=x"]), says_yes, []
        )


async def test_an_arm_on_its_own_server_says_nothing_of_the_stores_aliases(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's aliases point at adapters the proxy's upstream serves; an arm's own server (a
    hosted model) serves none of them, and its calls name none: its recording proxy must not
    warn of each alias falling back."""
    proxy, other = two_models
    async with aiohttp.ClientSession() as http:
        # The proxy's upstream serves the alias's model; the hosted arm's server does not.
        status, _ = await put_alias(http, proxy, {"model": FakeVllmConfig().model}, "policy")
        assert status == 200
    settings = _settings(proxy, tmp_path, model=[f"hosted@{other.base_url}"], repeats=1)
    with caplog.at_level(logging.WARNING):
        report = await run_evaluation(settings, says_yes, SCENARIOS)
    assert report.arms[0].rollouts == 3
    assert not [r for r in caplog.records if r.name.startswith("art_proxy.proxy.aliases")]


def test_pricing_the_arms_reads_litellms_own_price_table_not_the_networks() -> None:
    """litellm fetches its price list from the network at import unless told not to: an `eval`
    with no judge imports it first to price the arms, and must tell it too."""
    script = (
        "import os; from art_proxy.evaluation.report import litellm_prices; litellm_prices([]); "
        "print(os.environ.get('LITELLM_LOCAL_MODEL_COST_MAP'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "True"


async def test_a_stored_report_of_another_version_is_skipped_not_a_broken_page(
    sqlite_proxy: RunningProxy,
) -> None:
    """One report another version wrote (or a hand) made `/dashboard/evaluations` a 500."""
    store = sqlite_proxy.parts.store
    async with store.engine.begin() as connection:
        await connection.execute(
            sa.insert(schema.evaluations).values(
                id="from-elsewhere", created_at=datetime.now(UTC), report={"version": 99}
            )
        )
    before = store.unreadable_rows
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{sqlite_proxy.root_url}/dashboard/evaluations") as page,
    ):
        assert page.status == 200, await page.text()
    assert await store.evaluations() == []
    assert store.unreadable_rows > before


async def test_the_proxys_client_key_never_reaches_an_arms_own_server(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`eval --api-key` is the proxy's client key: an arm on its own server with no key of its own
    was sent it (2 requests in 3), a key that server has no business seeing."""
    from tests.test_security import fake_vllm_seeing_authorization

    proxy_key = "sk-proxy-client-5e7a9c1b3d"
    async with (
        running_fake_vllm(FakeVllmConfig(reply="no")) as upstream,
        fake_vllm_seeing_authorization() as (hosted, seen),
        running_proxy(proxy_settings(sqlite_url, upstream.base_url, api_key=proxy_key)) as proxy,
    ):
        settings = _settings(
            proxy,
            tmp_path,
            model=["base", f"{FakeVllmConfig().model}@{hosted}"],
            repeats=1,
            api_key=proxy_key,
        )
        report = await run_evaluation(settings, says_yes, SCENARIOS)
    assert [arm.rollouts for arm in report.arms] == [3, 3]
    assert seen and not [header for header in seen if header and proxy_key in header]


async def test_a_server_that_quotes_the_arms_key_in_its_401_leaves_it_out_of_the_report(
    two_models: tuple[RunningProxy, FakeVllm], tmp_path: Path
) -> None:
    """A key of any shape (this one is no `sk-` token the scrubber knows) quoted back by a 401
    reached the stored report and the dashboard."""
    key = "hunter2-plain-arm-key"

    async def refuses(request: web.Request) -> web.Response:
        said = request.headers.get("Authorization", "")
        return web.json_response(
            {"error": {"message": f"bad key {said.removeprefix('Bearer ')!r}"}}, status=401
        )

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "locked", "object": "model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", refuses)
    proxy, _ = two_models
    async with serving(app) as refusing:
        settings = _settings(
            proxy,
            tmp_path,
            model=["base", f"locked@{refusing}/v1"],
            repeats=1,
            arm_api_key=[f"locked={key}"],
        )
        report = await run_evaluation(settings, says_yes, SCENARIOS)
    locked = report.arms[1]
    assert locked.error is not None and "bad key" in locked.error, locked.error
    assert key not in locked.error
    async with TrajectoryStore.opened(proxy.parts.settings.store, writer=False) as store:
        (stored,) = await store.evaluations()
    assert key not in json.dumps(stored.model_dump(mode="json"))
