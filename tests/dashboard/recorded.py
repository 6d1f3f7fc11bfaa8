"""Filling a proxy with recorded data the dashboard shows: real calls through the proxy (one
trajectory carries script and an image with onerror, as text a hostile page could hold), a RULER
judgment and a short training run."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from art_proxy.proxy.server import RunningProxy
from art_proxy.records import (
    AliasRequest,
    Judgment,
    TeacherScore,
    TokenDisagreement,
    TrainingStep,
    TrajectoryScore,
)
from art_proxy.store.trajectory_store import utcnow

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src=x onerror="window.__pwned=1">'
HOSTILE_TASK = f"Summarise this page: {SCRIPT} {IMG}"
HOSTILE_TOOL_RESULT = f"page text {IMG}"
HOSTILE_EXPLANATION = f"Reached the goal in two calls. {SCRIPT}"
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Fetch a page.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
SCORES = {
    "good-1": (0.875, "Reached the goal in two calls."),
    "evil-1": (0.25, HOSTILE_EXPLANATION),
}
REWARDS_BY_STEP = [0.2, 0.35, 0.5, 0.7]


@dataclass(frozen=True)
class Recorded:
    group_id: str
    trajectory_ids: list[str]
    run: str


async def rollout(
    http: aiohttp.ClientSession,
    proxy: RunningProxy,
    *,
    scenario: str,
    trajectory: str,
    task: str,
    split: str = "train",
    reward: float | None = None,
) -> None:
    """Two calls: the model calls `lookup`, gets its result, answers; then the agent finishes."""
    headers = {"X-Art-Scenario": scenario, "X-Art-Trajectory": trajectory, "X-Art-Split": split}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You summarise web pages."},
        {"role": "user", "content": task},
    ]
    reply = await _chat(http, proxy, headers, messages)
    tool_call = reply["tool_calls"][0]
    messages.append(reply)
    messages.append(
        {"role": "tool", "tool_call_id": tool_call["id"], "content": HOSTILE_TOOL_RESULT}
    )
    messages.append(await _chat(http, proxy, headers, messages))
    async with http.post(
        f"{proxy.root_url}/art/v1/trajectories/{quote(trajectory, safe='')}/finish",
        json={"reward": reward},
    ) as response:
        assert response.status == 200, await response.text()


async def _chat(
    http: aiohttp.ClientSession,
    proxy: RunningProxy,
    headers: dict[str, str],
    messages: list[dict[str, Any]],
) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "tools": [LOOKUP_TOOL]}
    async with http.post(
        f"{proxy.base_url}/chat/completions", json=body, headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    message: dict[str, Any] = answer["choices"][0]["message"]
    return {key: value for key, value in message.items() if value is not None}


async def record_everything(http: aiohttp.ClientSession, proxy: RunningProxy) -> Recorded:
    """One judged group of two (one hostile), an unjudged val group, four trainer steps and the
    alias moves that served them."""
    # The hostile one first: its task becomes the scenario's opening, shown on the overview.
    await rollout(
        http, proxy, scenario="summarise", trajectory="evil-1", task=HOSTILE_TASK, reward=0.0
    )
    await rollout(
        http, proxy, scenario="summarise", trajectory="good-1", task="Summarise it.", reward=1.0
    )
    await rollout(
        http, proxy, scenario="held-out", trajectory="val-1", task="Held out.", split="val"
    )
    await proxy.parts.settled()
    store = proxy.parts.store
    good = await store.trajectory("good-1", with_calls=False)
    assert good is not None
    group_id = good.group_id
    await store.add_judgment(judgment(group_id, list(SCORES)))
    run = "run-1"
    evil = await store.trajectory("evil-1")
    assert evil is not None and evil.calls
    await store.record_teacher_scores(
        [
            TeacherScore(
                call_id=evil.calls[0].id,
                choice=0,
                trajectory_id="evil-1",
                run=run,
                step=1,
                teacher="teacher-model",
                kl=0.42,
                tokens=5,
                disagreements=[
                    TokenDisagreement(position=2, text=SCRIPT, sampled=-0.25, teacher=-5.5),
                    TokenDisagreement(position=0, text=" Sure", sampled=-0.5, teacher=-2.0),
                ],
                created_at=utcnow(),
            )
        ]
    )
    for step, reward in enumerate(REWARDS_BY_STEP, 1):
        await store.record_step(
            TrainingStep(
                run=run,
                step=step,
                status="applied",
                adapter=f"agent@{step}",
                swap="swapped",
                groups={group_id: "trained"} if step == 1 else {},
                metrics={
                    "reward_mean": reward,
                    "reward_std": 0.1,
                    "val_reward": reward - 0.05,
                    "loss": 1.0 / step,
                    "kl": 0.01 * step,
                    "teacher_kl": 0.5 / step,
                    "seconds_step": 2.0 * step,
                    "seconds_train": 1.5 * step,
                    "mismatch": 0.04,
                    "is_capped": 0.01 * step,
                    "clip_fraction": 0.02,
                    "staleness_mean": step / 2,
                    "staleness_max": float(step),
                    "pipeline_trainer_wait_s": 0.5 * step,
                    "pipeline_steps_ahead": 1.0,
                    "pipeline_admission_wait_s": 0.25,
                    "pipeline_queue_depth": 1.0,
                    "agent/used_tools": 0.5 + step / 10,
                },
                created_at=utcnow(),
            )
        )
        await store.set_alias(
            "agent", AliasRequest(model=f"agent@{step}", step=step, reason="swap")
        )
    return Recorded(group_id=group_id, trajectory_ids=list(SCORES), run=run)


def judgment(group_id: str, trajectory_ids: list[str]) -> Judgment:
    return Judgment(
        id=uuid.uuid4().hex,
        group_id=group_id,
        judge_model="openai/test-judge",
        mode="json",
        rubric_hash="rubric",
        cache_key=uuid.uuid4().hex,
        status="scored",
        trajectory_ids=trajectory_ids,
        scores=[
            TrajectoryScore(
                trajectory_id=trajectory_id,
                label=f"t{index}",
                score=SCORES[trajectory_id][0],
                explanation=SCORES[trajectory_id][1],
                reward=SCORES[trajectory_id][0],
            )
            for index, trajectory_id in enumerate(trajectory_ids, 1)
        ],
        attempts=1,
        order_agreement=0.5,
        created_at=utcnow(),
    )
