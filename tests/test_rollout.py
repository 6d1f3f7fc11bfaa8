"""The rollout runner: an agent run on a scenarios file through a real proxy (fake vLLM upstream).

The agents here use `rollout.openai_client()`, the OpenAI SDK against the proxy on loopback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from art_proxy.config import RolloutSettings
from art_proxy.errors import ConfigError, ScenarioFileError
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import ROLLOUT_ERROR
from art_proxy.rollout import (
    CANCELLED,
    Agent,
    GroupReport,
    Rollout,
    RolloutOutcome,
    RolloutReport,
    load_agent,
    ready_for_judging,
    run_rollouts,
)
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the fake vLLM's base model


async def ask_once(rollout: Rollout) -> str:
    async with rollout.openai_client() as client:
        reply = await client.chat.completions.create(
            model=rollout.model,
            messages=[{"role": "user", "content": json.dumps(rollout.scenario.input)}],
        )
    return reply.choices[0].message.content or ""


async def index_is_reward(rollout: Rollout) -> float:
    await ask_once(rollout)
    return rollout.index / 10


async def no_reward(rollout: Rollout) -> None:
    await ask_once(rollout)


def scenarios(*specs: tuple[str, str]) -> list[Scenario]:
    """(id, split) pairs as scenarios whose input names them."""
    return [
        Scenario.model_validate({"id": id_, "input": f"task {id_}", "split": split})
        for id_, split in specs
    ]


async def rollouts(
    proxy: RunningProxy, agent: Agent, run_on: list[Scenario], **options: Any
) -> RolloutReport:
    settings: dict[str, Any] = {
        "proxy_url": proxy.root_url,
        "group_size": 3,
        "concurrency": 4,
        "timeout_s": 30,
        "model": MODEL,
        **options,
    }
    return await run_rollouts(agent, run_on, **settings)


def only_group(report: RolloutReport) -> GroupReport:
    assert len(report.groups) == 1
    return report.groups[0]


async def test_each_scenario_becomes_one_group_finished_with_the_agents_rewards(
    proxy: RunningProxy,
) -> None:
    progress: list[tuple[int, int]] = []
    report = await rollouts(
        proxy,
        index_is_reward,
        scenarios(("trip", "train"), ("quiz", "val")),
        progress=lambda done, total: progress.append((done, total)),
    )

    assert report.rollouts == 6 and report.failed == 0 and report.warnings == []
    assert [done for done, _ in progress] == list(range(1, 7))
    await proxy.parts.settled()
    store = proxy.parts.store
    for group, split in zip(report.groups, ("train", "val"), strict=True):
        assert ready_for_judging(group)
        recorded = await store.trajectories(group=group.group_id)
        assert sorted(t.id for t in recorded) == sorted(group.trajectory_ids)
        for trajectory in recorded:
            assert trajectory.scenario_id == group.scenario_id
            assert trajectory.split == split and trajectory.status == "finished"
            assert trajectory.call_count == 1
            assert trajectory.reward == group.rewards[trajectory.id]
        assert sorted(r for r in group.rewards.values() if r is not None) == [0.0, 0.1, 0.2]


async def test_running_the_same_scenarios_twice_makes_two_groups(
    sqlite_proxy: RunningProxy,
) -> None:
    same = scenarios(("trip", "train"))
    first = only_group(await rollouts(sqlite_proxy, no_reward, same))
    second = only_group(await rollouts(sqlite_proxy, no_reward, same))

    assert first.group_id != second.group_id
    await sqlite_proxy.parts.settled()
    groups = await sqlite_proxy.parts.store.groups(scenario="trip")
    assert {group.id: group.size for group in groups} == {first.group_id: 3, second.group_id: 3}
    assert first.rewards == dict.fromkeys(first.trajectory_ids, None)


async def test_a_failing_agent_leaves_its_error_and_the_other_rollouts_go_on(
    sqlite_proxy: RunningProxy,
) -> None:
    async def fails_for_some(rollout: Rollout) -> float:
        if rollout.index == 1:
            raise RuntimeError("before any call")
        await ask_once(rollout)
        if rollout.index == 2:
            raise ValueError("the tool broke")
        return 1.0

    group = only_group(
        await rollouts(sqlite_proxy, fails_for_some, scenarios(("trip", "train")), group_size=4)
    )

    first, no_call, broke, last = group.trajectory_ids
    assert group.errors == {
        no_call: "RuntimeError: before any call",
        broke: "ValueError: the tool broke",
    }
    assert group.unrecorded == {no_call: "the agent made no call through rollout.base_url"}
    assert group.rewards == {first: 1.0, last: 1.0}
    assert group.succeeded == [first, last] and ready_for_judging(group)
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectory(broke, with_calls=False)
    assert recorded is not None and recorded.status == "finished"
    assert recorded.metadata == {ROLLOUT_ERROR: "ValueError: the tool broke"}
    assert recorded.reward is None


async def test_a_hanging_agent_is_cut_by_the_timeout_and_recorded(
    sqlite_proxy: RunningProxy,
) -> None:
    async def hangs_first(rollout: Rollout) -> float:
        await ask_once(rollout)
        if rollout.index == 0:
            await asyncio.sleep(3600)
        return 0.5

    # Long enough for a cold process's first SDK call (~0.8 s here, several times that on
    # busy cores) to come back before the timeout cuts the agent that hangs after it.
    report = await rollouts(
        sqlite_proxy, hangs_first, scenarios(("trip", "train")), group_size=2, timeout_s=5
    )

    group = only_group(report)
    hung, fine = group.trajectory_ids
    assert group.errors == {hung: "timeout after 5s"} and group.timed_out == [hung]
    assert report.timed_out == 1 and report.failed == 1 and report.seconds < 30
    assert group.rewards == {fine: 0.5} and not ready_for_judging(group)
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectory(hung, with_calls=False)
    assert recorded is not None and recorded.status == "finished"
    assert recorded.metadata == {ROLLOUT_ERROR: "timeout after 5s"}


async def test_a_cancelled_rollout_finishes_its_trajectory_before_it_stops(
    sqlite_proxy: RunningProxy,
) -> None:
    """A trainer shutting down cancels its rollouts: left open, each trajectory would hold its
    adapter's lease until the proxy's idle timeout (with 0, for ever)."""
    called = asyncio.Event()

    async def waits_on_a_tool(rollout: Rollout) -> float:
        await ask_once(rollout)
        called.set()
        await asyncio.sleep(3600)
        return 1.0

    groups: list[GroupReport] = []
    running = asyncio.create_task(
        run_rollouts(
            waits_on_a_tool,
            scenarios(("trip", "train")),
            proxy_url=sqlite_proxy.root_url,
            group_size=1,
            concurrency=1,
            timeout_s=0,
            model=MODEL,
            groups_out=groups,
        )
    )
    await asyncio.wait_for(called.wait(), 30)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await sqlite_proxy.parts.settled()
    (trajectory,) = groups[0].trajectory_ids
    recorded = await sqlite_proxy.parts.store.trajectory(trajectory, with_calls=False)
    assert recorded is not None and recorded.status == "finished"
    assert recorded.metadata == {ROLLOUT_ERROR: CANCELLED}


async def test_at_most_concurrency_agents_run_at_once(sqlite_proxy: RunningProxy) -> None:
    running = peak = 0

    async def counted(rollout: Rollout) -> float:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await ask_once(rollout)
        await asyncio.sleep(0.05)
        running -= 1
        return 1.0

    report = await rollouts(
        sqlite_proxy,
        counted,
        scenarios(("a", "train"), ("b", "train"), ("c", "train")),
        group_size=4,
        concurrency=3,
    )
    assert report.rollouts == 12 and report.failed == 0
    assert peak == 3


async def test_an_outcome_carries_metrics_and_metadata_and_a_bad_return_is_an_error(
    sqlite_proxy: RunningProxy,
) -> None:
    async def outcome_or_garbage(rollout: Rollout) -> Any:
        await ask_once(rollout)
        if rollout.index == 0:
            return RolloutOutcome(reward=0.75, metrics={"steps": 1.0}, metadata={"note": "ok"})
        return "not a reward"

    group = only_group(
        await rollouts(sqlite_proxy, outcome_or_garbage, scenarios(("t", "train")), group_size=2)
    )

    good, bad = group.trajectory_ids
    assert group.errors == {
        bad: "TypeError: the agent returned str, not a float, RolloutOutcome or None"
    }
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectory(good, with_calls=False)
    assert recorded is not None
    assert (recorded.reward, recorded.metrics, recorded.metadata) == (
        0.75,
        {"steps": 1.0},
        {"note": "ok"},
    )


async def test_an_agent_that_sets_only_the_base_url_keeps_its_split_and_one_without_is_warned(
    sqlite_proxy: RunningProxy,
) -> None:
    """The split rides in the base URL's path: an unmodified agent (a command given only
    OPENAI_BASE_URL) is recorded as a validation or an evaluation, never trained on. One that
    drops the path and the headers is warned."""
    import openai

    async def base_url_only(rollout: Rollout) -> None:
        async with openai.AsyncOpenAI(base_url=rollout.base_url, api_key="unused") as client:
            await client.chat.completions.create(
                model=rollout.model, messages=[{"role": "user", "content": "hi"}]
            )

    async def split_dropped(rollout: Rollout) -> None:
        stripped = rollout.base_url.replace("/split/val/", "/")
        async with openai.AsyncOpenAI(base_url=stripped, api_key="unused") as client:
            await client.chat.completions.create(
                model=rollout.model, messages=[{"role": "user", "content": "hi"}]
            )

    kept = await rollouts(sqlite_proxy, base_url_only, scenarios(("quiz", "val")))
    assert kept.failed == 0 and kept.warnings == []
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectories(group=kept.groups[0].group_id)
    assert {t.split for t in recorded} == {"val"}
    lost = await rollouts(sqlite_proxy, split_dropped, scenarios(("quiz", "val")))
    assert lost.warnings == [
        "scenario 'quiz' was recorded as split 'train', not 'val': the agent's client must "
        "send rollout.headers"
    ]


async def test_an_unreachable_proxy_is_a_config_error_before_any_rollout() -> None:
    started: list[Rollout] = []

    async def never(rollout: Rollout) -> None:
        started.append(rollout)

    with pytest.raises(ConfigError, match=r"the proxy at http://127\.0\.0\.1:9 is unreachable"):
        await run_rollouts(
            never,
            scenarios(("a", "train")),
            proxy_url="http://127.0.0.1:9",
            group_size=2,
            concurrency=1,
            timeout_s=0,
            model=MODEL,
        )
    assert started == []


async def test_the_proxys_keys_are_used_and_a_missing_admin_key_stops_the_run(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    keys = {"api_key": "client-key", "admin_key": "admin-key"}
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url, **keys)) as proxy:
        with pytest.raises(ConfigError, match=r"wants its admin key \(--admin-key\)$"):
            await rollouts(proxy, index_is_reward, scenarios(("a", "train")), api_key="client-key")
        with pytest.raises(ConfigError, match="refused the admin key given"):
            await rollouts(proxy, index_is_reward, scenarios(("a", "train")), admin_key="wrong")
        report = await rollouts(proxy, index_is_reward, scenarios(("a", "train")), **keys)
    group = only_group(report)
    assert report.failed == 0 and not group.unrecorded
    assert sorted(r for r in group.rewards.values() if r is not None) == [0.0, 0.1, 0.2]


def test_rollout_urls_and_headers_attribute_every_call() -> None:
    scenario = Scenario.model_validate({"id": "a b/c", "input": "x", "split": "val"})
    rollout = Rollout(
        scenario=scenario,
        proxy_url="http://proxy",
        trajectory_id="t",
        group_id="g",
        index=0,
        model=MODEL,
    )
    assert rollout.headers == {
        "X-Art-Scenario": "a b/c",
        "X-Art-Group": "g",
        "X-Art-Trajectory": "t",
        "X-Art-Split": "val",
    }
    assert rollout.proxy_url == "http://proxy"
    assert rollout.base_url == "http://proxy/scenario/a%20b%2Fc/group/g/trajectory/t/split/val/v1"
    client = rollout.openai_client()
    assert str(client.base_url) == rollout.base_url + "/"
    assert client.default_headers["X-Art-Split"] == "val"


def test_ready_for_judging_needs_two_successful_rollouts() -> None:
    group = GroupReport("g", "s", "train", ["a", "b", "c"], errors={"a": "x"})
    assert ready_for_judging(group)
    group.unrecorded["b"] = "no call"
    assert not ready_for_judging(group)


# --- the scenarios file -------------------------------------------------------------------------


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "scenarios.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_scenarios_load_with_defaults_and_ids_hashed_from_the_input(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"input": {"q": 1, "hint": "h"}}',
        "",
        '{"id": "named", "input": "Plan a trip.", "split": "val", "reference": "Lyon", '
        '"metadata": {"level": 2}}',
    )
    hashed, named = load_scenarios(path)
    assert hashed.split == "train" and hashed.reference is None and hashed.metadata == {}
    assert hashed.id.startswith("input-")
    # Canonical JSON: the same input written with its keys in another order is the same scenario.
    again = load_scenarios(write(tmp_path, '{"input": {"hint": "h", "q": 1}}'))
    assert again[0].id == hashed.id
    assert named == Scenario(
        id="named", input="Plan a trip.", split="val", reference="Lyon", metadata={"level": 2}
    )


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON"),
        ('["input"]', "not a JSON object"),
        ('{"id": "x"}', "missing 'input'"),
        ('{"input": null}', "input: must not be null"),
        ('{"input": "q", "split": "test"}', "split: Input should be 'train', 'val' or 'prod'"),
        ('{"input": "q", "id": 7}', "id: Input should be a valid string"),
        ('{"input": "q", "id": ""}', "id: must be 1 to 200 printable ASCII characters"),
        ('{"input": "q", "id": "' + "x" * 201 + '"}', "id: must be 1 to 200 printable"),
        ('{"input": "q", "id": "a\\nb"}', "id: must be 1 to 200 printable"),
        ('{"input": "q", "id": "caf\u00e9"}', "id: must be 1 to 200 printable ASCII"),
        ('{"input": "q", "metadata": []}', "metadata: Input should be a valid dictionary"),
        ('{"input": "q", "refrence": 1}', "unknown field 'refrence'"),
        ('{"id": "first", "input": "again"}', "duplicate id 'first' (first on line 1"),
    ],
)
def test_a_bad_scenarios_line_is_reported_with_file_and_line(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write(tmp_path, '{"id": "first", "input": "q"}', "", line)
    with pytest.raises(ScenarioFileError) as raised:
        load_scenarios(path)
    assert str(raised.value).startswith(f"{path}:3: {reason}")
    assert "\n" not in str(raised.value)


def test_the_same_input_twice_without_ids_is_a_duplicate(tmp_path: Path) -> None:
    path = write(tmp_path, '{"input": "q"}', '{"input": "q"}')
    with pytest.raises(ScenarioFileError, match=r":2: duplicate id 'input-[0-9a-f]+'"):
        load_scenarios(path)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_scenarios_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(ScenarioFileError, match=f"^{path}: no scenarios"):
        load_scenarios(path)


def test_a_missing_scenarios_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioFileError, match="cannot read the scenarios file"):
        load_scenarios(tmp_path / "absent.jsonl")


# --- loading the agent --------------------------------------------------------------------------

AGENT_FILE = """
from art_proxy.rollout import Rollout, RolloutOutcome


async def agent(rollout: Rollout) -> RolloutOutcome:
    async with rollout.openai_client() as client:
        reply = await client.chat.completions.create(
            model=rollout.model, messages=[{"role": "user", "content": str(rollout.scenario.input)}]
        )
    reward = 1.0 if reply.choices[0].message.content else 0.0
    return RolloutOutcome(reward=reward, metrics={"tool_calls": 2.0, "turns": 1.0})


def not_async(rollout: Rollout) -> float:
    return 1.0
"""


def agent_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_agent.py"
    path.write_text(AGENT_FILE)
    return path


def test_load_agent_from_a_file_or_a_module(tmp_path: Path) -> None:
    from_file = load_agent(f"{agent_file(tmp_path)}:agent")
    assert from_file.__name__ == "agent"
    assert load_agent("tests.test_rollout:index_is_reward") is index_is_reward


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not MODULE:FUNCTION or FILE.py:FUNCTION"),
        ("{dir}/absent.py:agent", "absent.py' does not exist"),
        ("{dir}/my_agent.py:missing", "has no 'missing'"),
        ("{dir}/my_agent.py:not_async", "is not an async function"),
        ("no_such_module_here:agent", "ModuleNotFoundError: No module named"),
    ],
)
def test_a_bad_agent_spec_is_a_one_line_config_error(
    tmp_path: Path, spec: str, message: str
) -> None:
    agent_file(tmp_path)
    with pytest.raises(ConfigError, match=message) as raised:
        load_agent(spec.format(dir=tmp_path))
    assert "\n" not in str(raised.value)


# --- art-proxy rollout --------------------------------------------------------------------------


def rollout_command(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "rollout", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


async def test_rollout_command_runs_an_agent_file_and_prints_a_summary(
    sqlite_proxy: RunningProxy, tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        '{"id": "trip", "input": "Plan a trip."}',
        '{"id": "quiz", "input": "2+2?", "split": "val"}',
        '{"id": "later", "input": "Prod task", "split": "prod"}',
    )
    args = ["--agent", f"{agent_file(tmp_path)}:agent", "--scenarios", str(path)]
    args += ["--proxy", sqlite_proxy.root_url, "--group-size", "2", "--model", MODEL]
    done = await asyncio.to_thread(rollout_command, *args, "--split", "val")

    assert done.returncode == 0, done.stderr
    assert "rollouts in" in done.stdout
    assert "HTTP Request" not in done.stderr  # the agent's SDK does not log each call
    rows = [line.split("│")[1:-1] for line in done.stdout.splitlines() if line.startswith("│")]
    # split, groups, judgeable, rollouts, failed, timed out, mean reward
    assert [[cell.strip() for cell in row] for row in rows] == [
        ["val", "1", "1", "2", "0", "0", "1.000"],
        ["val", "2.000", "1.000"],  # what the agent reported: tool calls, turns
    ]
    assert "tool_calls" in done.stdout and "turns" in done.stdout
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectories()
    assert [(t.scenario_id, t.split, t.reward) for t in recorded] == [("quiz", "val", 1.0)] * 2


def test_rollout_command_reports_a_bad_scenarios_line_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{"input": "q"}', '{"input": "q", "split": "test"}')
    done = rollout_command("--agent", f"{agent_file(tmp_path)}:agent", "--scenarios", str(path))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: {path}:2: split: Input should be 'train', 'val' or 'prod'"
    ]


def test_rollout_command_reports_an_unreachable_proxy_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, '{"input": "q"}')
    done = rollout_command(
        "--agent",
        f"{agent_file(tmp_path)}:agent",
        "--scenarios",
        str(path),
        "--proxy",
        "http://127.0.0.1:9",
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the proxy at http://127.0.0.1:9 is")


def test_the_default_model_is_the_one_local_llm_serves() -> None:
    from art_proxy.local.model_loading import BUNDLED_NAME

    settings = RolloutSettings.model_validate({"agent": "a:b", "scenarios": "s.jsonl"})
    assert settings.model == BUNDLED_NAME


async def test_scenario_ids_that_need_quoting_reach_the_store_unchanged(
    sqlite_proxy: RunningProxy,
) -> None:
    report = await rollouts(
        sqlite_proxy, no_reward, scenarios(("trip to a/b? #1 %", "train")), group_size=2
    )
    assert report.failed == 0 and not only_group(report).unrecorded
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectories()
    assert {t.scenario_id for t in recorded} == {"trip to a/b? #1 %"}


FAILING_AGENT_FILE = """
async def agent(rollout):
    raise RuntimeError(f"broken {rollout.index}")
"""


async def test_rollout_command_lists_failures_and_fails_when_none_succeeded(
    sqlite_proxy: RunningProxy, tmp_path: Path
) -> None:
    (tmp_path / "failing.py").write_text(FAILING_AGENT_FILE)
    path = write(tmp_path, '{"id": "trip", "input": "Plan a trip."}')
    args = ["--agent", f"{tmp_path / 'failing.py'}:agent", "--scenarios", str(path)]
    done = await asyncio.to_thread(
        rollout_command, *args, "--proxy", sqlite_proxy.root_url, "--group-size", "2"
    )
    assert done.returncode == 1
    assert "RuntimeError: broken 0" in done.stdout and "RuntimeError: broken 1" in done.stdout
    assert done.stderr.strip().splitlines() == ["error: no rollout succeeded"]
