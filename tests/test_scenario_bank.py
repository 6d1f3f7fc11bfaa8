"""`art-proxy scenario-bank`: production conversations' openings become replayable scenarios.

One scenario per distinct opening (the proxy keys auto scenarios by it), only for the split asked,
newest first, in the format `art-proxy rollout` reads.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from art_proxy.proxy.server import RunningProxy
from art_proxy.scenarios import load_scenarios
from art_proxy.store.trajectory_store import TrajectoryStore

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SYSTEM = {"role": "system", "content": "You book restaurants."}


def scenario_bank(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "scenario-bank", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def converse(
    http: aiohttp.ClientSession, proxy: RunningProxy, opening: str, split: str
) -> None:
    """Two turns from `opening`: the scenario is the conversation before the first reply."""
    messages: list[Any] = [SYSTEM, {"role": "user", "content": opening}]
    for follow_up in ("and for four?", None):
        async with http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": MODEL, "messages": messages},
            headers={"X-Art-Split": split},
        ) as response:
            assert response.status == 200, await response.text()
            reply = (await response.json())["choices"][0]["message"]
        messages.append({key: value for key, value in reply.items() if value is not None})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})


async def test_bank_holds_each_prod_opening_once_newest_first(
    proxy: RunningProxy, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await converse(http, proxy, "A table in Lyon", "prod")
    await converse(http, proxy, "A table in Lyon", "prod")  # the same opening again
    await converse(http, proxy, "Practice task", "train")
    await converse(http, proxy, "A table in Paris", "prod")
    out = tmp_path / "bank.jsonl"
    await proxy.parts.settled()  # the bank reads the store from another process

    result = await asyncio.to_thread(
        scenario_bank, "--store", proxy.parts.settings.store, "--out", str(out)
    )

    assert result.returncode == 0, result.stderr
    assert "wrote 2 scenarios" in result.stderr
    scenarios = load_scenarios(out)
    openings = [s.input["messages"][-1]["content"] for s in scenarios]
    assert openings == ["A table in Paris", "A table in Lyon"]
    stored = {s.id: s for s in await proxy.parts.store.scenarios()}
    for scenario in scenarios:
        assert scenario.split == "train"
        assert scenario.input == {"messages": stored[scenario.id].opening}
        assert scenario.input["messages"][0] == SYSTEM
        assert scenario.metadata["source"] == "prod"
        assert scenario.metadata["first_seen"] == stored[scenario.id].created_at.isoformat()


async def test_bank_takes_the_split_asked_and_a_limit(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await converse(http, proxy, "A table in Lyon", "prod")
    await converse(http, proxy, "Practice task", "train")
    await converse(http, proxy, "Another practice task", "train")
    store = proxy.parts.settings.store
    await proxy.parts.settled()  # the bank reads the store from another process

    result = await asyncio.to_thread(scenario_bank, "--store", store, "--split", "train")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all('"source":"train"' in line for line in lines)

    result = await asyncio.to_thread(
        scenario_bank, "--store", store, "--split", "train", "--limit", "1"
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and "Another practice task" in result.stdout


async def test_bank_of_a_store_without_prod_traffic_is_empty(tmp_path: Path) -> None:
    out = tmp_path / "bank.jsonl"
    url = f"sqlite:///{tmp_path / 'art.db'}"
    async with TrajectoryStore.opened(url, writer=False):
        pass  # a store, with nothing in it (one that does not exist is refused)
    result = await asyncio.to_thread(scenario_bank, "--store", url, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "wrote 0 scenarios" in result.stderr and out.read_text() == ""


def test_unreachable_or_bad_store_is_a_one_line_error(tmp_path: Path) -> None:
    result = scenario_bank(
        "--store", "postgresql://postgres@127.0.0.1:1/nowhere", "--out", str(tmp_path / "b.jsonl")
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error:") and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr
    # Not a database URL at all: a usage error, before anything starts.
    for store in ("mysql://x/y", "art.db"):
        result = scenario_bank("--store", store, "--out", str(tmp_path / "b.jsonl"))
        assert result.returncode == 2, result.stderr
        [error] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert "is not a SQLite or PostgreSQL URL" in error
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "b.jsonl").exists()
