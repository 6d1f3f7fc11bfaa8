"""An agent that is a command (`--agent 'exec:python my_agent.py'`), run the way a user runs their
own script: the task its last argument, the OpenAI SDK pointed at the rollout's trajectory by the
environment alone, the reward its last line of output, a non-zero exit a failed rollout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from art_proxy.config import EvalSettings
from art_proxy.errors import ConfigError
from art_proxy.evaluation.run import run_evaluation
from art_proxy.proxy.server import RunningProxy
from art_proxy.rollout import load_agent, run_rollouts
from art_proxy.scenarios import Scenario

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the fake vLLM's base model

# A user's script: nothing of art-proxy in it, the SDK configured by the environment.
SCRIPT = """
import os, sys
from openai import OpenAI

task = sys.argv[-1]
if task == "break":
    print("the tool is down", file=sys.stderr)
    sys.exit(3)
reply = OpenAI().chat.completions.create(
    model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": task}]
)
print(reply.choices[0].message.content)
if task != "unscored":
    print("reward: 0.75")
"""


def _agent(tmp_path: Path) -> str:
    script = tmp_path / "my_agent.py"
    script.write_text(SCRIPT)
    return f"exec:{sys.executable} {script}"


async def test_a_command_agent_is_recorded_in_its_trajectory_and_split_with_its_reward(
    sqlite_proxy: RunningProxy, tmp_path: Path
) -> None:
    tasks = [
        Scenario(id="solve", input="What is 17 times 23?"),
        Scenario(id="held", input="unscored", split="val"),
        Scenario(id="broken", input="break"),
    ]
    report = await run_rollouts(
        load_agent(_agent(tmp_path)),
        tasks,
        proxy_url=sqlite_proxy.root_url,
        group_size=2,
        concurrency=6,
        timeout_s=60,
        model=MODEL,
    )
    solve, held, broken = report.groups
    assert list(solve.rewards.values()) == [0.75, 0.75] and not solve.errors
    assert list(held.rewards.values()) == [None, None] and not held.errors  # a judge's to score
    assert (
        list(broken.errors.values())
        == [f"RuntimeError: {sys.executable} exited 3: the tool is down"] * 2
    )
    await sqlite_proxy.parts.settled()
    for group, split in ((solve, "train"), (held, "val")):
        recorded = await sqlite_proxy.parts.store.trajectories(group=group.group_id)
        assert sorted(t.id for t in recorded) == sorted(group.trajectory_ids)
        assert {(t.split, t.call_count) for t in recorded} == {(split, 1)}


async def test_eval_runs_the_command_the_readme_has_you_write(
    sqlite_proxy: RunningProxy, tmp_path: Path
) -> None:
    """`eval` took an async `rollout(r)` only, which the user had to write from concepts.md."""
    settings = EvalSettings.model_validate(
        {
            "store": sqlite_proxy.parts.settings.store,
            "proxy": sqlite_proxy.root_url,
            "agent": _agent(tmp_path),
            "scenarios": "unused.jsonl",
            "model": ["base"],
            "repeats": 2,
            "out": str(tmp_path / "eval"),
        }
    )
    tasks = [Scenario(id="solve", input="What is 17 times 23?", split="val")]
    report = await run_evaluation(settings, load_agent(settings.agent), tasks)
    [base] = report.arms
    assert (base.rollouts, base.failed, base.reward.mean) == (2, 0, 0.75)
    await sqlite_proxy.parts.settled()
    recorded = await sqlite_proxy.parts.store.trajectories(limit=10)
    assert {t.split for t in recorded} == {"eval"}  # measured, never trained on


def test_an_empty_command_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="name the command after 'exec:'"):
        load_agent("exec:  ")
