"""A canary: a candidate serves a share of an alias's new trajectories beside its target.

Each trajectory's arm is drawn from its id (and the canary's start), so every proxy over the store,
and one restarted, draws the same; the lease keeps a trajectory on its arm. A canary on 0% ends
and 100% serves the candidate alone, as a moved alias does; any move of the alias ends its canary.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings
from tests.test_aliases import ALIAS, load_adapter, put_alias, served_by
from tests.wire_client import admin_get

CANDIDATE, TARGET = f"{ALIAS}@2", f"{ALIAS}@1"
TRAJECTORIES = [f"t{i}" for i in range(200)]


async def test_a_canary_serves_its_share_each_trajectory_stays_on_its_arm_across_a_restart(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    for name in (TARGET, CANDIDATE):
        await load_adapter(http, vllm, name, tmp_path)
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as proxy:
        assert (await put_alias(http, proxy, {"model": TARGET, "step": 1}))[0] == 200
        status, move = await put_alias(
            http, proxy, {"model": CANDIDATE, "reason": "canary", "fraction": 0.25, "note": "why"}
        )
        assert status == 200 and move["reason"] == "canary" and move["previous"] == TARGET
        first = {t: await served_by(http, proxy, t, "turn 1") for t in TRAJECTORIES}
        aliases = await admin_get(http, proxy, "/aliases")
    # The alias itself did not move; a quarter of the trajectories went to the candidate.
    [record] = aliases["data"]
    assert record["model"] == TARGET and record["canary"] == CANDIDATE
    assert record["canary_fraction"] == 0.25
    assert set(first.values()) == {TARGET, CANDIDATE}
    share = sum(model == CANDIDATE for model in first.values()) / len(TRAJECTORIES)
    assert 0.15 < share < 0.35
    async with running_proxy(settings) as restarted:
        # Open trajectories keep their arm (their lease, read back from the store), and a new
        # proxy draws the same arm for the same id.
        again = {t: await served_by(http, restarted, t, "turn 2") for t in TRAJECTORIES[:40]}
        drawn = {t: restarted.parts.aliases.resolve(ALIAS, t) for t in TRAJECTORIES}
    assert again == {t: first[t] for t in TRAJECTORIES[:40]}
    assert drawn == first


@pytest.fixture
async def canary_proxy(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> RunningProxy:
    """A proxy whose alias serves TARGET, CANDIDATE loaded beside it."""
    for name in (TARGET, CANDIDATE):
        await load_adapter(http, vllm, name, tmp_path)
    assert (await put_alias(http, proxy, {"model": TARGET, "step": 1}))[0] == 200
    return proxy


async def canary(http: aiohttp.ClientSession, proxy: RunningProxy, fraction: float) -> None:
    body = {"model": CANDIDATE, "reason": "canary", "fraction": fraction}
    assert (await put_alias(http, proxy, body))[0] == 200


async def test_a_canary_on_none_or_all_of_the_traffic_is_the_alias_as_it_was_or_moved(
    canary_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await canary(http, canary_proxy, 1.0)
    assert {await served_by(http, canary_proxy, t, "hi") for t in TRAJECTORIES[:30]} == {CANDIDATE}
    await canary(http, canary_proxy, 0.0)
    assert {await served_by(http, canary_proxy, t, "hi") for t in TRAJECTORIES[30:60]} == {TARGET}
    [record] = (await admin_get(http, canary_proxy, "/aliases"))["data"]
    assert record["model"] == TARGET and record["canary"] is None
    assert record["canary_fraction"] == 0


async def test_a_move_of_the_alias_ends_its_canary_and_a_canary_needs_an_alias_and_a_share(
    canary_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await canary(http, canary_proxy, 0.5)
    assert (await put_alias(http, canary_proxy, {"model": TARGET, "reason": "kept"}))[0] == 200
    assert {await served_by(http, canary_proxy, t, "hi") for t in TRAJECTORIES[:30]} == {TARGET}
    status, body = await put_alias(
        http, canary_proxy, {"model": CANDIDATE, "reason": "canary", "fraction": 0.5}, "nope"
    )
    assert status == 404 and "does not exist" in body["error"]["message"]
    for bad in (
        {"model": CANDIDATE, "reason": "canary"},
        {"model": CANDIDATE, "fraction": 0.5},
        {"model": CANDIDATE, "reason": "canary", "fraction": 1.5},
    ):
        status, body = await put_alias(http, canary_proxy, bad)
        assert status == 400 and body["error"]["type"] == "BadRequestError", bad


async def test_a_decision_on_a_canary_that_no_longer_runs_is_refused_and_moves_nothing(
    canary_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """A second trainer (or one that polled before an operator's move) decides on stale
    evidence: its move names the canary it decides, which has ended, so nothing moves."""
    await canary(http, canary_proxy, 0.25)
    [record] = (await admin_get(http, canary_proxy, "/aliases"))["data"]
    began = record["canary_since"]
    assert (await put_alias(http, canary_proxy, {"model": TARGET, "reason": "rollback"}))[0] == 200
    for stale in (
        {"model": CANDIDATE, "reason": "promote", "canary_since": began},
        {"model": CANDIDATE, "reason": "canary", "fraction": 0.5, "canary_since": began},
    ):
        status, body = await put_alias(http, canary_proxy, stale)
        assert status == 409 and "no longer running" in body["error"]["message"], body
    [record] = (await admin_get(http, canary_proxy, "/aliases"))["data"]
    assert (record["model"], record["canary"]) == (TARGET, None)
    status, body = await put_alias(
        http, canary_proxy, {"model": TARGET, "reason": "canary", "fraction": 0.5}
    )
    assert status == 409 and "serves" in body["error"]["message"]  # no canary of the target
