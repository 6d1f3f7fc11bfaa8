"""The examples, the README and the docs/ pages run as written (their python blocks run here)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.rollout import load_agent, run_rollouts
from art_proxy.scenarios import load_scenarios
from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from tests.conftest import proxy_settings, trajectories

ROOT = Path(__file__).resolve().parent.parent
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


async def run_openai_sdk_example(base_url: str, rollouts: int) -> None:
    """The example as a user runs it: only the environment points it at the proxy."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "unused",
        "ART_MODEL": MODEL,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples/openai_sdk/agent.py"),
        "--rollouts",
        str(rollouts),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, output.decode()


async def test_openai_sdk_example_records_one_group_of_stitched_trajectories(
    proxy: RunningProxy,
) -> None:
    await run_openai_sdk_example(proxy.base_url, rollouts=3)
    await proxy.parts.settled()
    trajectories = await proxy.parts.store.trajectories()
    assert len(trajectories) == 3
    assert len({t.group_id for t in trajectories}) == 1
    await proxy.parts.settled()
    calls = await proxy.parts.store.calls([t.id for t in trajectories])
    for trajectory in trajectories:
        recorded = calls[trajectory.id]
        assert [c.seq for c in recorded] == [0, 1]
        assert all(c.trainable for c in recorded) and recorded[1].stitched


async def test_an_unmodified_agent_names_its_scenario_and_group_by_base_url_alone(
    proxy: RunningProxy,
) -> None:
    # A per-run base URL is the other path that needs no code change: the scenario and group
    # ride in the URL, the turns are still stitched automatically.
    await run_openai_sdk_example(f"{proxy.root_url}/scenario/sky/group/batch-1/v1", rollouts=2)
    await proxy.parts.settled()
    trajectories = await proxy.parts.store.trajectories()
    assert {(t.scenario_id, t.group_id) for t in trajectories} == {("sky", "batch-1")}
    await proxy.parts.settled()
    calls = await proxy.parts.store.calls([t.id for t in trajectories])
    assert sorted(len(recorded) for recorded in calls.values()) == [2, 2]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("Banana.", 1.0), ("Red apple", 0.5), ("A sentence far too long to end in eight tokens", 0.0)],
    ids=["one-word", "two-words", "cut-off"],
)
async def test_the_demos_agent_file_is_rewarded_one_over_its_words(
    sqlite_url: str, reply: str, expected: float
) -> None:
    # `make demo` names the agent by its file, as here; the fake answers in the model's stead.
    agent = load_agent("examples/single_word/agent.py:rollout")
    config = FakeVllmConfig(reply=reply)
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
    ):
        report = await run_rollouts(
            agent,
            load_scenarios(ROOT / "examples/single_word/scenarios.jsonl")[:1],
            proxy_url=proxy.root_url,
            group_size=2,
            concurrency=2,
            timeout_s=60,
            model=config.model,
        )
        found = await trajectories(proxy)
    assert report.failed == 0
    assert sorted(t.reward or 0.0 for t in found) == [expected, expected]
    assert all(t.status == "finished" and t.call_count == 1 for t in found)


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def documented_python_blocks() -> list[Any]:
    """Every ```python block of the README and of each docs/ page, named by its file."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    params: list[Any] = []
    for page in pages:
        name = page.relative_to(ROOT).as_posix()
        for i, block in enumerate(python_blocks(page.read_text()), start=1):
            params.append(pytest.param(name, block, id=f"{name}-{i}"))
    return params


@pytest.mark.parametrize(("page", "block"), documented_python_blocks())
def test_documented_python_blocks_run(page: str, block: str) -> None:
    exec(compile(block, page, "exec"), {})


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    assert "make test" in (ROOT / ".ci/run").read_text()
