"""`art-proxy judge` on groups the proxy recorded (fake vLLM upstream), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console

from art_proxy.config import JudgeSettings
from art_proxy.proxy.server import RunningProxy
from art_proxy.records import ROLLOUT_ERROR, TrainingStep
from art_proxy.ruler.command import run_judge, summary
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import Totals
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import Reply, answer_by_content, running_scripted_judge

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def judge_command(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "judge", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


async def run_agent(proxy: RunningProxy, scenario: str, trajectory: str, turns: int) -> None:
    """One agent run of `turns` turns, attributed by URL, then finished."""
    base_url = f"{proxy.root_url}/scenario/{scenario}/trajectory/{trajectory}/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused") as client:
        messages: list[Any] = [{"role": "user", "content": f"Task of {scenario}: plan a trip."}]
        for turn in range(turns):
            reply = await client.chat.completions.create(model=MODEL, messages=messages)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": f"Not done yet ({turn + 1})."})
    async with aiohttp.ClientSession() as http:
        finish = f"{proxy.root_url}/art/v1/trajectories/{trajectory}/finish"
        async with http.post(finish, json={}) as response:
            assert response.status == 200, await response.text()


def fewer_turns_is_better(text: str) -> float:
    return round(1.0 - 0.2 * text.count("Not done yet"), 3)


async def test_judge_scores_recorded_groups_and_skips_a_group_of_one(
    proxy: RunningProxy, tmp_path: Path
) -> None:
    for trajectory, turns in (("quick", 1), ("slow", 3), ("middle", 2)):
        await run_agent(proxy, "trip", trajectory, turns)
    await run_agent(proxy, "lonely", "alone", 1)
    store_url = proxy.parts.settings.store
    args = ["--store", store_url, "--judge", "openai/scripted", "--wait", "0"]

    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        first = await asyncio.to_thread(judge_command, *args, "--judge-base-url", judge.base_url)
        again = await asyncio.to_thread(judge_command, *args, "--judge-base-url", judge.base_url)

    assert first.returncode == 0, first.stderr
    # The group of three shown in two orders (the default), none for the group of one.
    assert len(judge.requests) == 2, "two calls for the group of three, none for the group of one"
    assert "Task of trip: plan a trip." in judge.prompt()
    assert re.search(r"1 │ scored", first.stdout) and re.search(r"1 │ skipped", first.stdout)
    assert "has 1 finished trajectory" in first.stdout
    assert again.returncode == 0, again.stderr
    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        judgments = {j.status: j for j in await store.judgments()}
    finally:
        await store.aclose()
    assert sorted(judgments) == ["scored", "skipped"]
    scored = judgments["scored"]
    assert {s.trajectory_id: s.score for s in scored.scores} == {
        "quick": 1.0,
        "slow": 0.6,
        "middle": 0.8,
    }
    assert scored.judge_model == "openai/scripted" and scored.prompt_tokens > 0
    assert scored.order_agreement == 1.0  # it scores the conversations, not their places
    assert judgments["skipped"].trajectory_ids == ["alone"]


def settings(store_url: str, judge_url: str, **overrides: Any) -> JudgeSettings:
    """Judge settings, each group shown in one order: one call a group."""
    return JudgeSettings.model_validate(
        {
            "store": store_url,
            "judge": "openai/scripted",
            "judge_base_url": judge_url,
            "judge_orders": 1,
            **overrides,
        }
    )


async def judge_in_process(settings: JudgeSettings) -> Totals:
    quiet = Console(file=io.StringIO())
    return await run_judge(settings, DEFAULT_RUBRIC, quiet, quiet)


async def test_judge_waits_for_a_full_group_or_the_wait(proxy: RunningProxy) -> None:
    await run_agent(proxy, "trip", "done-1", 1)
    await run_agent(proxy, "trip", "done-2", 2)
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        waiting = await judge_in_process(settings(store_url, judge.base_url, group_size=3))
        assert waiting.judged == 0 and judge.requests == []
        full = await judge_in_process(settings(store_url, judge.base_url, group_size=2))
        assert full.scored == 1 and len(judge.requests) == 1
        done = await judge_in_process(settings(store_url, judge.base_url, wait=0))
        assert done.judged == 0 and len(judge.requests) == 1


async def test_judge_reports_its_totals_to_mlflow(
    proxy: RunningProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "judging")
    await run_agent(proxy, "trip", "done-1", 1)
    await run_agent(proxy, "trip", "done-2", 2)
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        totals = await judge_in_process(
            settings(store_url, judge.base_url, wait=0, report_to=["mlflow"])
        )
    assert totals.scored == 1
    client = MlflowClient()
    experiment = client.get_experiment_by_name("judging")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "judge" and run.info.status == "FINISHED"
    assert run.data.metrics["groups_scored"] == 1 and run.data.metrics["prompt_tokens"] > 0
    assert run.data.params["judge"] == "['openai/scripted']"


async def start_run(proxy: RunningProxy, scenario: str, trajectory: str) -> None:
    """One call of a run that is not finished."""
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.root_url}/scenario/{scenario}/trajectory/{trajectory}/v1",
        api_key="unused",
    ) as client:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Task of {scenario}: plan a trip."}]
        )


async def test_an_open_member_is_left_out_once_the_wait_is_over(proxy: RunningProxy) -> None:
    await run_agent(proxy, "trip", "done-1", 1)
    await run_agent(proxy, "trip", "done-2", 2)
    await start_run(proxy, "trip", "still-open")
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        waiting = await judge_in_process(settings(store_url, judge.base_url, group_size=3))
        over = await judge_in_process(settings(store_url, judge.base_url, wait=0))
    assert waiting.judged == 0 and over.scored == 1
    assert "still-open" not in judge.prompt()


async def test_an_unreachable_judge_leaves_a_readable_record(proxy: RunningProxy) -> None:
    await run_agent(proxy, "trip", "a", 1)
    await run_agent(proxy, "trip", "b", 2)
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(Reply("overloaded", status=503)) as judge:
        totals = await judge_in_process(
            settings(store_url, judge.base_url, wait=0, judge_retries=1, judge_backoff=0.01)
        )
        again = await judge_in_process(settings(store_url, judge.base_url, wait=0))
    assert totals.judge_failed == 1 and len(judge.requests) == 2
    reason = totals.failures[0].reason
    assert reason is not None and "judge unavailable after 2 tries" in reason
    assert "overloaded" in reason
    assert again.judged == 0, "a failed group is judged again only with --retry-failed"


async def test_a_rollout_whose_agent_failed_is_left_out_of_the_judgment(
    proxy: RunningProxy,
) -> None:
    for trajectory, turns in (("quick", 1), ("slow", 3), ("crashed", 2)):
        await run_agent(proxy, "trip", trajectory, turns)
    async with aiohttp.ClientSession() as http:
        finish = f"{proxy.root_url}/art/v1/trajectories/crashed/finish"
        body = {"metadata": {ROLLOUT_ERROR: "RuntimeError: the tool broke"}}
        async with http.post(finish, json=body) as response:
            assert response.status == 200, await response.text()
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        totals = await judge_in_process(settings(store_url, judge.base_url, group_size=3))
    assert totals.scored == 1
    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        (judgment,) = await store.judgments()
    finally:
        await store.aclose()
    assert judgment.trajectory_ids == ["quick", "slow"]
    assert [score.trajectory_id for score in judgment.scores] == ["quick", "slow"]


def test_a_missing_rubric_file_is_a_one_line_error(sqlite_url: str, tmp_path: Path) -> None:
    result = judge_command(
        "--store", sqlite_url, "--judge", "openai/x", "--rubric", str(tmp_path / "nope.txt")
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0
    assert "rubric file" in result.stderr and "does not exist" in result.stderr


def test_an_empty_rubric_file_is_a_one_line_error(sqlite_url: str, tmp_path: Path) -> None:
    empty = tmp_path / "rubric.txt"
    empty.write_text("  \n")
    result = judge_command("--store", sqlite_url, "--judge", "openai/x", "--rubric", str(empty))
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: rubric file {empty} is empty"


async def test_watch_judges_groups_as_they_become_ready_until_interrupted(
    proxy: RunningProxy,
) -> None:
    store_url = proxy.parts.settings.store
    store = await TrajectoryStore.open(store_url, writer=False)
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        watcher = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "art-proxy"),
            *("judge", "--store", store_url, "--judge", "openai/scripted", "--watch"),
            *("--judge-orders", "1"),
            *("--judge-base-url", judge.base_url, "--group-size", "2", "--poll", "0.1"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            for scenario in ("first", "second"):
                await run_agent(proxy, scenario, f"{scenario}-a", 1)
                await run_agent(proxy, scenario, f"{scenario}-b", 2)
                await until_judged(store, count=1 if scenario == "first" else 2)
        finally:
            watcher.send_signal(signal.SIGINT)
            stdout, stderr = await asyncio.wait_for(watcher.communicate(), 30)
            await store.aclose()
    assert watcher.returncode == 0, stderr.decode()
    assert re.search(r"2 │ scored", stdout.decode())
    assert len(judge.requests) == 2


async def until_judged(store: TrajectoryStore, count: int) -> None:
    for _ in range(600):
        if len(await store.judgments()) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {count} judgments within a minute")


async def test_nothing_ready_says_why_and_what_finishes_a_run(proxy: RunningProxy) -> None:
    await run_agent(proxy, "trip", "done", 1)
    await start_run(proxy, "trip", "open")
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        base = ["--store", store_url, "--judge", "openai/scripted", "--judge-base-url"]
        full = await asyncio.to_thread(judge_command, *base, judge.base_url, "--group-size", "3")
        waited = await asyncio.to_thread(judge_command, *base, judge.base_url, "--wait", "0")
    assert full.returncode == 0 and waited.returncode == 0, full.stderr + waited.stderr
    assert "nothing to judge yet: 1 group is not ready" in full.stderr
    assert "1 of --group-size 3 runs finished, 1 still open" in full.stderr
    assert "--idle-timeout seconds" in " ".join(full.stderr.split())  # the open run's way out
    said = " ".join(waited.stderr.split())
    assert "1 of its runs still open, 1 finished" in said
    assert "--idle-timeout seconds (300 by default)" in said
    assert "/art/v1/trajectories/{id}/finish" in said and "--watch judges each group" in said
    assert judge.requests == []


async def test_runs_with_no_answered_call_are_left_out_and_judgments_are_served(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    for trajectory, turns in (("quick", 1), ("slow", 3)):
        await run_agent(proxy, "trip", trajectory, turns)
    # A run whose every call failed (a model name the upstream does not serve), then finished.
    failed_url = f"{proxy.root_url}/scenario/trip/trajectory/failed/v1"
    async with openai.AsyncOpenAI(base_url=failed_url, api_key="unused", max_retries=0) as client:
        with contextlib.suppress(openai.NotFoundError):
            await client.chat.completions.create(
                model="no-such-model",
                messages=[{"role": "user", "content": "Task of trip: plan a trip."}],
            )
    async with http.post(f"{proxy.root_url}/art/v1/trajectories/failed/finish", json={}) as r:
        assert r.status == 200
    store_url = proxy.parts.settings.store
    async with running_scripted_judge(answer_by_content(fewer_turns_is_better)) as judge:
        done = await asyncio.to_thread(
            judge_command,
            *("--store", store_url, "--judge", "openai/scripted", "--wait", "0"),
            *("--judge-base-url", judge.base_url),
        )
    assert done.returncode == 0, done.stderr
    assert "judged 1/1: 1 scored, 0 failed, 0 skipped" in done.stderr  # no terminal: a line
    async with http.get(f"{proxy.root_url}/art/v1/judgments") as response:
        assert response.status == 200
        [judgment] = (await response.json())["data"]
    assert judgment["status"] == "scored"
    assert sorted(judgment["trajectory_ids"]) == ["quick", "slow"]


def test_a_judge_that_cannot_work_stops_the_command_at_start(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'art.db'}"
    unprefixed = judge_command("--store", store, "--judge", "SmolLM2-135M-Instruct")
    assert unprefixed.returncode == 1
    assert unprefixed.stderr.startswith("error: judge 'SmolLM2-135M-Instruct': litellm cannot")
    assert "openai/SmolLM2-135M-Instruct" in unprefixed.stderr
    nowhere = judge_command(
        "--store", store, "--judge", "openai/x", "--judge-base-url", "http://127.0.0.1:9/v1"
    )
    assert nowhere.returncode == 1
    assert "judge base URL http://127.0.0.1:9/v1 does not answer" in " ".join(
        nowhere.stderr.split()
    )
    for result in (unprefixed, nowhere):
        assert "Traceback" not in result.stderr and "Provider List" not in result.stdout


async def test_a_group_a_trainer_consumed_is_not_judged_again_under_a_new_rubric(
    sqlite_url: str,
) -> None:
    """A new rubric makes every group unjudged by it; those already trained on cost calls that
    no step would read."""
    async with TrajectoryStore.opened(sqlite_url) as store:
        trained, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
        fresh, _ = await record_group(store, [answered("Nice"), answered("Lille")])
        await store.record_step(
            TrainingStep(
                run="r", step=1, status="applied", groups={trained: "trained"}, created_at=utcnow()
            )
        )
    async with running_scripted_judge(answer_by_content(lambda _text: 0.5)) as judge:
        totals = await judge_in_process(settings(sqlite_url, judge.base_url, wait=0))
    async with TrajectoryStore.opened(sqlite_url, writer=False) as store:
        judged = {judgment.group_id for judgment in await store.judgments()}
    assert totals.scored == 1 and judged == {fresh} and len(judge.requests) == 1


def test_the_summarys_title_is_one_line_at_80_columns() -> None:
    """A narrow table wrapped its title over three lines ("art-proxy judge:", the model...)."""
    settings = JudgeSettings.model_validate(
        {
            "store": "sqlite:///x.db",
            "judge": ["openai/SmolLM2-135M-Instruct"],
            "judge_mode": "logprob",
        }
    )
    terminal = Console(width=80, record=True, file=io.StringIO())
    terminal.print(summary(Totals(scored=2), settings))
    assert terminal.export_text().splitlines()[0].strip() == (
        "art-proxy judge: openai/SmolLM2-135M-Instruct (logprob)"
    )
