"""The judge check (`art-proxy judge --check`, and `train --judge` before its first step): a
scripted perfect judge passes, a judge that scores at random or by position is stopped."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import pytest

from art_proxy.records import Judgment, TrajectoryScore
from art_proxy.ruler.check import check_judgments
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import (
    Body,
    Reply,
    answer_by_content,
    json_answer,
    running_scripted_judge,
    trajectories_in,
)

QUALITY = ("wrong", "poor", "fair", "good")  # the answers of a group, worst to best


def quality(text: str) -> float:
    """What a perfect judge scores: the answer's quality, read off its text."""
    return next(i for i, word in enumerate(QUALITY) if f"answer: {word}" in text) / 3


def at_random(seed: int) -> Reply | object:
    draw = random.Random(seed)

    def answer(body: Body) -> Reply:
        return json_answer([(label, draw.random()) for label in trajectories_in(body)])

    return answer


def by_position(body: Body) -> Reply:
    """The first shown scores lowest: the bundled small judge's habit."""
    labels = list(trajectories_in(body))
    return json_answer([(label, index / len(labels)) for index, label in enumerate(labels)])


async def _groups(store_url: str, count: int, *, rewards: bool) -> None:
    async with TrajectoryStore.opened(store_url) as store:
        for _ in range(count):
            order = list(range(len(QUALITY)))
            random.Random(count).shuffle(order)
            await record_group(
                store,
                [answered(f"answer: {QUALITY[i]}") for i in order],
                rewards=[i / 3 for i in order] if rewards else None,
            )


def check_command(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "judge", "--check", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("script", "passes", "words"),
    [
        (answer_by_content(quality), True, "its orders agree at Kendall tau +1.00"),
        (at_random(7), False, "below 0.3"),
        (by_position, False, "its orders agree at Kendall tau -1.00"),
    ],
    ids=["perfect", "random", "by-position"],
)
async def test_the_check_passes_a_perfect_judge_and_stops_a_random_or_positional_one(
    sqlite_url: str, script: object, passes: bool, words: str
) -> None:
    await _groups(sqlite_url, 4, rewards=True)
    async with running_scripted_judge(script) as judge:  # type: ignore[arg-type]  # a Script
        done = await asyncio.to_thread(
            check_command,
            "--store",
            sqlite_url,
            "--judge",
            "openai/j",
            "--judge-base-url",
            judge.base_url,
            "--judge-orders",
            "1",
        )
    assert done.returncode == (0 if passes else 1), done.stderr
    line = done.stdout.strip()
    assert len(line.splitlines()) == 1 and words in line, line
    assert line.startswith("judge check on 4 groups")
    if passes:
        assert "agrees with the agent's rewards at tau +1.00" in line
    else:
        assert "Try a stronger judge (--judge" in line
    assert len(judge.requests) == 4 * 2  # 2 orders a group, however few --judge-orders asks
    async with TrajectoryStore.opened(sqlite_url, writer=False) as store:
        assert await store.judgments() == []  # a check stores no judgment
        [kept] = await store.judge_checks()  # but what it found, for a trainer to heed
    assert (kept.judge_model, kept.passed, kept.failed, kept.groups) == (
        "openai/j", passes, not passes, 4,
    )  # fmt: skip
    assert kept.line == line


def test_the_check_needs_groups_and_says_so(sqlite_url: str) -> None:
    done = check_command(
        "--store", sqlite_url, "--judge", "openai/j", "--judge-base-url", "http://127.0.0.1:9/v1"
    )
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error:")
    assert len(done.stderr.strip().splitlines()) == 1


def _judgment(scores: list[float], agreement: float | None) -> Judgment:
    return Judgment.model_validate(
        {
            "id": "j",
            "group_id": "g",
            "judge_model": "m",
            "mode": "json",
            "rubric_hash": "r",
            "cache_key": "k",
            "status": "scored",
            "trajectory_ids": [f"t{i}" for i in range(len(scores))],
            "scores": [
                TrajectoryScore(
                    trajectory_id=f"t{i}", label=f"t{i}", score=s, reward=s, explanation=""
                )
                for i, s in enumerate(scores)
            ],
            "attempts": 1,
            "created_at": "2026-11-28T00:00:00Z",
            "order_agreement": agreement,
        }
    )


def test_nothing_measured_neither_passes_nor_fails() -> None:
    check = check_judgments([_judgment([0.1, 0.9], None)], {}, 0.3)
    assert (check.passed, check.failed) == (False, False)
    assert "nothing to measure" in check.line()
    known = {"t0": 0.0, "t1": 1.0}
    assert check_judgments([_judgment([0.1, 0.9], None)], known, 0.3).passed
    assert check_judgments([_judgment([0.9, 0.1], 0.8)], known, 0.3).failed  # disagrees with them
