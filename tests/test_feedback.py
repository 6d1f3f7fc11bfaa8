"""Feedback from production: a user's score, thumbs or comment, attached to a trajectory.

`POST /art/v1/feedback` appends it (admin key when one is set), `GET .../{id}/feedback` lists it,
and `as_reward` also makes it the reward of a finished trajectory (an open one is refused).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.ruler.prompt import build_prompt
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import finished_members
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings
from tests.wire_client import admin_get, post

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ADMIN_KEY = "sk-admin-feedback-91c2"


async def record(http: aiohttp.ClientSession, proxy: RunningProxy, trajectory: str) -> None:
    """One answered call filed under `trajectory`, in the prod split."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Book a table"}]}
    async with http.post(
        f"{proxy.base_url}/chat/completions",
        json=body,
        headers={"X-Art-Trajectory": trajectory, "X-Art-Split": "prod"},
    ) as response:
        assert response.status == 200, await response.text()


async def send_feedback(
    http: aiohttp.ClientSession,
    proxy: RunningProxy,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.post(
        f"{proxy.root_url}/art/v1/feedback", json=body, headers=headers or {}
    ) as response:
        return response.status, await response.json()


async def test_feedback_is_stored_and_listed_oldest_first(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await record(http, proxy, "chat-1")
    sent = [
        {"trajectory_id": "chat-1", "thumbs": "up"},
        {"trajectory_id": "chat-1", "score": 0.25, "comment": "slow, but right"},
    ]
    for body in sent:
        status, stored = await send_feedback(http, proxy, body)
        assert status == 200, stored
        assert stored["trajectory_id"] == "chat-1" and len(stored["id"]) == 32

    listed = (await admin_get(http, proxy, "/trajectories/chat-1/feedback"))["data"]
    assert [(f["score"], f["thumbs"], f["comment"]) for f in listed] == [
        (None, "up", None),
        (0.25, None, "slow, but right"),
    ]
    trajectory = await admin_get(http, proxy, "/trajectories/chat-1")
    assert trajectory["reward"] is None  # feedback alone never touches the reward


async def test_feedback_on_an_unknown_trajectory_is_404(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    status, body = await send_feedback(http, sqlite_proxy, {"trajectory_id": "nope", "score": 1})
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    assert body["error"]["param"] == "trajectory_id"
    async with http.get(f"{sqlite_proxy.root_url}/art/v1/trajectories/nope/feedback") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == 404


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"trajectory_id": "chat-1"},  # says nothing
        {"trajectory_id": "chat-1", "score": 1.5},
        {"trajectory_id": "chat-1", "score": "high"},
        {"trajectory_id": "chat-1", "thumbs": "sideways"},
        {"trajectory_id": "chat-1", "comment": "x" * 4001},
        {"trajectory_id": "chat-1", "comment": "ok", "as_reward": True},  # no reward in it
        {"trajectory_id": "chat-1", "thumbs": "up", "headers": {"Authorization": "x"}},
        [{"trajectory_id": "chat-1", "thumbs": "up"}],
    ],
    ids=[
        "empty",
        "nothing-said",
        "score-above-1",
        "score-not-a-number",
        "bad-thumbs",
        "comment-too-long",
        "as-reward-without-reward",
        "unknown-field",
        "not-an-object",
    ],
)
async def test_bad_feedback_body_is_400(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, body: Any
) -> None:
    await record(http, sqlite_proxy, "chat-1")
    status, answer = await send_feedback(http, sqlite_proxy, body)
    assert status == 400 and answer["error"]["type"] == "BadRequestError"
    listed = await admin_get(http, sqlite_proxy, "/trajectories/chat-1/feedback")
    assert listed["data"] == []


async def test_feedback_that_is_not_json_is_400(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{sqlite_proxy.root_url}/art/v1/feedback", data=b"{thumbs") as response:
        assert response.status == 400
        assert (await response.json())["error"]["code"] == 400


async def test_feedback_needs_the_admin_key(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, admin_key=ADMIN_KEY)
    async with running_proxy(settings) as proxy:
        await record(http, proxy, "chat-1")
        body = {"trajectory_id": "chat-1", "thumbs": "down"}
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            status, answer = await send_feedback(http, proxy, body, headers=headers)
            assert status == 401 and answer["error"]["type"] == "AuthenticationError"
        async with http.get(f"{proxy.root_url}/art/v1/trajectories/chat-1/feedback") as response:
            assert response.status == 401

        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        status, _ = await send_feedback(http, proxy, body, headers=admin)
        assert status == 200
        async with http.get(
            f"{proxy.root_url}/art/v1/trajectories/chat-1/feedback", headers=admin
        ) as response:
            assert [f["thumbs"] for f in (await response.json())["data"]] == ["down"]


@pytest.mark.parametrize(
    ("feedback", "reward"),
    [({"score": 0.75, "thumbs": "down"}, 0.75), ({"thumbs": "up"}, 1.0), ({"thumbs": "down"}, 0.0)],
)
async def test_feedback_as_reward_sets_the_reward_of_a_finished_trajectory(
    proxy: RunningProxy, http: aiohttp.ClientSession, feedback: dict[str, Any], reward: float
) -> None:
    await record(http, proxy, "chat-1")
    status, _ = await post(http, f"{proxy.root_url}/art/v1/trajectories/chat-1/finish", {})
    assert status == 200

    body = {"trajectory_id": "chat-1", "as_reward": True, **feedback}
    status, stored = await send_feedback(http, proxy, body)
    assert status == 200, stored
    assert "as_reward" not in stored
    trajectory = await admin_get(http, proxy, "/trajectories/chat-1")
    assert trajectory["status"] == "finished" and trajectory["reward"] == reward


async def test_feedback_as_reward_on_an_open_trajectory_is_409_and_stores_nothing(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await record(http, proxy, "chat-1")
    body = {"trajectory_id": "chat-1", "score": 1.0, "as_reward": True}
    status, answer = await send_feedback(http, proxy, body)
    assert status == 409 and answer["error"]["type"] == "ConflictError"
    assert answer["error"]["param"] == "as_reward"
    assert (await admin_get(http, proxy, "/trajectories/chat-1/feedback"))["data"] == []
    trajectory = await admin_get(http, proxy, "/trajectories/chat-1")
    assert trajectory["status"] == "open" and trajectory["reward"] is None


async def test_the_judge_sees_users_feedback(
    proxy: RunningProxy, http: aiohttp.ClientSession, store_url: str
) -> None:
    for trajectory in ("chat-1", "chat-2"):
        await record(http, proxy, trajectory)
        await post(http, f"{proxy.root_url}/art/v1/trajectories/{trajectory}/finish", {})
    body = {"trajectory_id": "chat-2", "thumbs": "down", "comment": "it booked the wrong day"}
    assert (await send_feedback(http, proxy, body))[0] == 200

    trajectory = await admin_get(http, proxy, "/trajectories/chat-2")
    store = await TrajectoryStore.open(store_url)
    try:
        members = await finished_members(store, trajectory["group_id"])
    finally:
        await store.aclose()
    assert [len(member.feedback) for member in members] == [0, 1]
    text = str(build_prompt(members, DEFAULT_RUBRIC, "json").messages[1]["content"])
    assert '[user feedback] thumbs down, "it booked the wrong day"' in text
