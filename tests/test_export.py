"""`art-proxy export`: one trajectory a line, with its messages, calls and token ids."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import datasets
import openai
import pytest
from trl.data_utils import is_conversational

from art_proxy.proxy.server import RunningProxy
from art_proxy.records import ExportedTrajectory
from tests.conftest import trajectories
from tests.test_training_store import judgment

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def export(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "export", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def two_turns(proxy: RunningProxy, opening: str, split: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-Split": split}
    ) as client:
        messages: list[Any] = [{"role": "user", "content": opening}]
        for follow_up in ("go on", None):
            reply = await client.chat.completions.create(model=MODEL, messages=messages)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            if follow_up:
                messages.append({"role": "user", "content": follow_up})


async def test_export_writes_one_trajectory_a_line(proxy: RunningProxy, tmp_path: Path) -> None:
    await two_turns(proxy, "first task", "train")
    await two_turns(proxy, "second task", "val")
    store = proxy.parts.settings.store
    await proxy.parts.settled()  # export reads the store from another process
    out = tmp_path / "out.jsonl"
    result = await asyncio.to_thread(export, "--store", store, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "exported 2 trajectories" in result.stderr
    lines = [ExportedTrajectory.model_validate_json(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert line.trainable
        calls = line.trajectory.calls
        assert calls is not None and len(calls) == 2
        assert all(call.prompt_token_ids and call.completion_token_ids for call in calls)
        assert [m["role"] for m in line.messages] == ["user", "assistant", "user", "assistant"]


async def test_export_filters_by_split_to_standard_output(proxy: RunningProxy) -> None:
    await two_turns(proxy, "train task", "train")
    await two_turns(proxy, "val task", "val")
    store = proxy.parts.settings.store
    await proxy.parts.settled()  # export reads the store from another process
    result = await asyncio.to_thread(export, "--store", store, "--split", "val")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 1 and lines[0]["trajectory"]["split"] == "val"
    assert lines[0]["messages"][0]["content"] == "val task"


async def test_export_as_parquet_loads_in_datasets_with_the_stores_ids(
    proxy: RunningProxy, tmp_path: Path
) -> None:
    await two_turns(proxy, "first task", "train")
    await two_turns(proxy, "second task", "val")
    store = proxy.parts.settings.store
    await proxy.parts.settled()  # export reads the store from another process
    [judged] = await proxy.parts.store.trajectories(split="train")
    await proxy.parts.store.add_judgment(judgment(judged.group_id, {judged.id: 0.75}))
    out = tmp_path / "calls.parquet"
    result = await asyncio.to_thread(
        export, "--store", store, "--format", "parquet", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert "exported 2 trajectories" in result.stderr
    rows = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert len(rows) == 4  # a row per call (one choice each)
    recorded = await trajectories(proxy)
    calls = {call.id: (t, call) for t in recorded for call in t.calls or []}
    for row in rows:
        trajectory, call = calls[row["call_id"]]
        assert row["trajectory_id"] == trajectory.id and row["group_id"] == trajectory.group_id
        assert row["split"] == trajectory.split and row["seq"] == call.seq
        assert row["prompt_token_ids"] == call.prompt_token_ids
        assert call.completion_token_ids is not None and call.logprobs is not None
        assert row["completion_token_ids"] == call.completion_token_ids[0]
        assert row["logprobs"] == pytest.approx(call.logprobs[0], abs=1e-6)  # float32
        assert row["trainable"] is True
        assert (row["call_status"], row["error"]) == ("ok", None)
        assert row["judged_reward"] == (0.75 if trajectory.id == judged.id else None)
        assert json.loads(row["messages"])[0]["content"] in ("first task", "second task")
    assert {row["split"] for row in rows} == {"train", "val"}

    saved = tmp_path / "calls"
    result = await asyncio.to_thread(
        export, "--store", store, "--format", "hf", "--out", str(saved)
    )
    assert result.returncode == 0, result.stderr
    assert datasets.load_from_disk(str(saved))["call_id"] == rows["call_id"]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "look_up",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


async def test_trl_rows_are_conversational_with_tools_rewards_advantages_and_failures(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """TRL reads a row as it is: `is_conversational` holds, the tools go with it, and the
    trajectory's reward comes with its GRPO advantage (less its group's mean) and KTO's label; a
    refused call keeps its status and reason."""
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        for trajectory, reward in (("worse", 0.2), ("better", 0.9)):
            headers = {"X-Art-Group": "g", "X-Art-Trajectory": trajectory}
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "look up 'tern'"}],
                tools=TOOLS,  # type: ignore[arg-type]  # the SDK's TypedDicts
                extra_headers=headers,
            )
            if trajectory == "worse":
                with pytest.raises(openai.BadRequestError):
                    await client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "again"}],
                        extra_body={"logprobs": "many"},  # refused by the proxy
                        extra_headers=headers,
                    )
            finish = f"{proxy.root_url}/art/v1/trajectories/{trajectory}/finish"
            async with http.post(finish, json={"reward": reward}) as response:
                assert response.status == 200
    await proxy.parts.settled()  # export reads the store from another process
    store = proxy.parts.settings.store
    result = await asyncio.to_thread(export, "--store", store, "--format", "trl")
    assert result.returncode == 0, result.stderr
    assert "exported 3 rows" in result.stderr
    rows = {(r["trajectory_id"], r["seq"]): r for r in map(json.loads, result.stdout.splitlines())}
    for trajectory, advantage in (("worse", -0.35), ("better", 0.35)):
        row = rows[(trajectory, 0)]
        assert is_conversational(row)
        assert row["prompt"] == [{"role": "user", "content": "look up 'tern'"}]
        assert row["completion"][0]["role"] == "assistant" and row["tools"] == TOOLS
        assert row["advantage"] == pytest.approx(advantage)
        assert row["label"] is (advantage > 0) and row["call_status"] == "ok"
    refused = rows[("worse", 1)]
    assert refused["call_status"] == "rejected" and "logprobs" in refused["error"]
    assert refused["completion"] is None and refused["trainable"] is False

    # The fake answers every prompt alike: no reply is better than another, so no pair.
    pairs = await asyncio.to_thread(export, "--store", store, "--format", "trl", "--pairs")
    assert pairs.returncode == 0, pairs.stderr
    assert "exported 0 preference pairs" in pairs.stderr and pairs.stdout == "", pairs.stdout


def test_pairs_are_trls_in_one_line() -> None:
    result = export("--store", "sqlite:///nowhere.db", "--pairs")
    assert result.returncode != 0
    assert "--pairs is for --format trl" in result.stderr and "Traceback" not in result.stderr


def test_parquet_needs_a_file_in_one_line() -> None:
    result = export("--store", "sqlite:///nowhere.db", "--format", "parquet")
    assert result.returncode != 0
    assert "--format parquet writes to disk" in result.stderr and "Traceback" not in result.stderr
