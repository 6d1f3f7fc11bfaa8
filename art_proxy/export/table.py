"""`art-proxy export --format parquet|hf`: the recorded calls as a table other trainers read.

One row per sampled choice of every call: its trajectory, group, scenario, split, reward (the
agent's or a user's) and judged reward (RULER's, in the group's newest scored judgment), the
exact prompt and completion token ids with the logprob each completion token was sampled at
(what TRL, verl, OpenRLHF or ART need to train on it, or to correct for the sampler), whether it
is trainable and why not, and the call's messages, reply and sampling as JSON text. Every
completion token was sampled, so the loss mask is the completion itself. A Parquet file, which
`datasets.load_dataset("parquet", data_files=...)` and pandas read as they are; written a batch of
rows at a time, so an export of any size fits in memory. `hf` writes the same rows as a Hugging
Face dataset directory (`datasets.load_from_disk`).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from art_proxy.errors import ConfigError
from art_proxy.privacy.private_files import create_private, make_private
from art_proxy.records import CallRecord, ExportedTrajectory

# Rows written to the file at a time.
BATCH_ROWS = 1024


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("trajectory_id", pa.string()),
            ("group_id", pa.string()),
            ("scenario_id", pa.string()),
            ("split", pa.string()),
            ("status", pa.string()),
            ("reward", pa.float64()),
            ("judged_reward", pa.float64()),
            ("call_id", pa.string()),
            ("seq", pa.int32()),
            ("choice", pa.int32()),
            ("kind", pa.string()),
            ("model", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int32())),
            ("completion_token_ids", pa.list_(pa.int32())),
            ("logprobs", pa.list_(pa.float32())),
            ("trainable", pa.bool_()),
            ("untrainable_reason", pa.string()),
            ("call_status", pa.string()),
            ("error", pa.string()),
            ("stitched", pa.bool_()),
            ("messages", pa.string()),
            ("completion", pa.string()),
            ("sampling", pa.string()),
        ]
    )


def call_rows(exported: ExportedTrajectory) -> Iterator[dict[str, Any]]:
    """A row per sampled choice of each of the trajectory's calls (one for a call that failed)."""
    trajectory = exported.trajectory
    for call in trajectory.calls or []:
        choices: list[list[int] | None] = [None]
        if call.completion_token_ids:
            choices = list(call.completion_token_ids)
        for choice, ids in enumerate(choices):
            logprobs = call.logprobs[choice] if call.logprobs else None
            yield {
                "trajectory_id": trajectory.id,
                "group_id": trajectory.group_id,
                "scenario_id": trajectory.scenario_id,
                "split": trajectory.split,
                "status": trajectory.status,
                "reward": trajectory.reward,
                "judged_reward": exported.judged_reward,
                "call_id": call.id,
                "seq": call.seq,
                "choice": choice,
                "kind": call.kind,
                "model": call.model,
                "prompt_token_ids": call.prompt_token_ids,
                "completion_token_ids": ids,
                "logprobs": logprobs,
                "trainable": call.trainable,
                "untrainable_reason": call.untrainable_reason,
                "call_status": call.status,
                "error": call.error,
                "stitched": call.stitched,
                "messages": _json(_prompt_of(call)),
                "completion": _completion_text(call, choice),
                "sampling": _json(call.sampling),
            }


async def write_parquet(trajectories: AsyncIterable[ExportedTrajectory], path: Path) -> int:
    """Every row of `trajectories` into a Parquet file at `path`; how many trajectories."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError(
            "--format parquet needs pyarrow: pip install 'art-proxy[export]'"
        ) from exc
    schema = _schema()
    count = 0
    rows: list[dict[str, Any]] = []
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    create_private(partial)  # the writer keeps its mode
    with pq.ParquetWriter(partial, schema) as writer:
        async for exported in trajectories:
            count += 1
            rows.extend(call_rows(exported))
            if len(rows) >= BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                rows = []
        if rows or not count:
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    partial.replace(path)  # whole or absent: a killed export leaves no half a file under its name
    return count


async def write_hf_dataset(trajectories: AsyncIterable[ExportedTrajectory], path: Path) -> int:
    """The rows of `write_parquet` as a `datasets` directory at `path`; how many trajectories."""
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError("--format hf needs datasets: pip install 'art-proxy[export]'") from exc
    staged = path.with_name(path.name + ".parquet")
    count = await write_parquet(trajectories, staged)
    try:
        # Its Arrow copy in a cache of its own, deleted after: `datasets`' default cache (under
        # ~/.cache) would keep every exported user's words where no `forget` reaches.
        with tempfile.TemporaryDirectory(prefix="art-proxy-export-") as cache:
            dataset = datasets.Dataset.from_parquet(str(staged), cache_dir=cache)
            dataset.save_to_disk(str(path))
        make_private(path)
    finally:
        staged.unlink(missing_ok=True)
    return count


def _prompt_of(call: CallRecord) -> Any:
    request = call.request
    return request.get("messages") if call.kind == "chat" else request.get("prompt")


def _completion_text(call: CallRecord, choice: int) -> str | None:
    choices = (call.response or {}).get("choices")
    if not isinstance(choices, list) or choice >= len(choices):
        return None
    picked = choices[choice]
    if not isinstance(picked, dict):
        return None
    if call.kind == "completion":
        text = picked.get("text")
        return text if isinstance(text, str) else None
    message = picked.get("message")
    return _json(message) if isinstance(message, dict) else None


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()
