"""The periodic reads against a large store: a judge round with nothing new, the trainer's poll,
the dashboard's first page, at 100,000 and 1,000,000 trajectories.

    .venv/bin/python benchmarks/store_reads.py [--sizes 100000,1000000] [--store-dir DIR]

Each size is a SQLite store seeded as production traffic leaves one (made once, kept in
--store-dir and reused while it holds that size): groups of two one-call trajectories, every group
judged and consumed by the trainer's run, so there is nothing new for any reader. Each read runs as
its process runs it: the judge's `GroupJudge.ready_groups`, the trainer's poll
(`store.trainable_groups` from its `JudgedSince` cursor), the dashboard's
`DashboardQueries.group_page`. First: the first read of a process (a judge or trainer that just
started reads every group once); then the median of 5 steady reads (a watching judge's round, a
trainer's poll every 2 s). Target: each steady read under 50 ms at 1,000,000. The last line is the
key figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import GroupJudge, Readiness
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.dashboard import DashboardQueries, GroupFilter
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy_trainer.sidecar import JudgedSince

SIZES = (100_000, 1_000_000)
TARGET_MS = 50.0
RUN = "prod-run"
GROUP_SIZE = 2
STEADY_READS = 5
_BATCH = 20_000  # groups inserted per transaction while seeding


def _text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(" ", "microseconds")[:26]


def _rows(trajectories: int, ruler: Ruler) -> Iterator[dict[str, list[tuple[Any, ...]]]]:
    """The seed, a batch of groups at a time: scenarios, groups, trajectories, calls,
    judgments and consumptions, dated a second apart ending now."""
    groups = trajectories // GROUP_SIZE
    start = utcnow() - timedelta(seconds=groups)
    request = json.dumps({"model": "agent", "messages": [{"role": "user", "content": "hi"}]})
    response = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hello"}}]})
    for first in range(0, groups, _BATCH):
        batch: dict[str, list[tuple[Any, ...]]] = {
            name: []
            for name in ("scenarios", "groups", "trajectories", "calls", "judgments", "consumed")
        }
        for g in range(first, min(first + _BATCH, groups)):
            at = _text(start + timedelta(seconds=g))
            scenario, group = f"s{g // 10}", f"g{g:08d}"
            if g % 10 == 0:
                batch["scenarios"].append((scenario, at, 1, "[]"))
            batch["groups"].append((group, scenario, at))
            members = [f"t{g:08d}-{m}" for m in range(GROUP_SIZE)]
            for member in members:
                batch["trajectories"].append(
                    (
                        member,
                        scenario,
                        group,
                        "train",
                        "finished",
                        "idle",
                        at,
                        at,
                        at,
                        "http://127.0.0.1:8000/v1",
                        1,
                        "{}",
                        "{}",
                    )
                )
                batch["calls"].append(
                    (
                        f"c{member}",
                        member,
                        0,
                        "chat",
                        at,
                        10.0,
                        "http://127.0.0.1:8000/v1",
                        "ok",
                        200,
                        0,
                        "agent",
                        request,
                        response,
                        "{}",
                        "[1,2,3]",
                        "[[4,5]]",
                        "[[-0.1,-0.2]]",
                        1,
                        0,
                        "new",
                        "openai",
                    )
                )
            scores = [
                {
                    "trajectory_id": member,
                    "label": f"t{i + 1}",
                    "score": 0.5,
                    "explanation": "",
                    "reward": 0.5,
                }
                for i, member in enumerate(members)
            ]
            batch["judgments"].append(
                (
                    f"j{g:08d}",
                    group,
                    ruler.judge_model,
                    ruler.settings.mode,
                    ruler.rubric_hash,
                    f"k{g}",
                    "scored",
                    json.dumps(members),
                    json.dumps(scores),
                    1,
                    0,
                    0,
                    0.0,
                    at,
                    ruler.settings.reward.name,
                )
            )
            batch["consumed"].append((RUN, group, 1 + g // 8, "trained", at))
        yield batch


_INSERTS = {
    "scenarios": "INSERT INTO scenarios (id, created_at, auto, opening) VALUES (?,?,?,?)",
    "groups": "INSERT INTO groups (id, scenario_id, created_at) VALUES (?,?,?)",
    "trajectories": "INSERT INTO trajectories (id, scenario_id, group_id, split, status, "
    "finish_reason, created_at, updated_at, finished_at, upstream, call_count, metrics, metadata) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "calls": "INSERT INTO calls (id, trajectory_id, seq, kind, created_at, latency_ms, upstream, "
    "status, http_status, stream, model, request, response, sampling, prompt_token_ids, "
    "completion_token_ids, logprobs, trainable, stitched, attribution, dialect) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "judgments": "INSERT INTO judgments (id, group_id, judge_model, mode, rubric_hash, cache_key, "
    "status, trajectory_ids, scores, attempts, prompt_tokens, completion_tokens, cost_usd, "
    "created_at, reward_rule) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "consumed": "INSERT INTO consumed_groups (run, group_id, step, outcome, consumed_at) "
    "VALUES (?,?,?,?,?)",
}


async def seeded(directory: Path, trajectories: int) -> str:
    """The URL of a store of `trajectories`, seeded unless one is already there."""
    path = directory / f"store-{trajectories}.db"
    url = f"sqlite:///{path}"
    marker = path.with_suffix(".seeded")
    if marker.exists():
        return url
    path.unlink(missing_ok=True)
    async with TrajectoryStore.opened(url, writer=False) as store:  # the schema, by migrations
        ruler = _ruler(store)
    started = time.perf_counter()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        for batch in _rows(trajectories, ruler):
            for table, rows in batch.items():
                db.executemany(_INSERTS[table], rows)
            db.commit()
    marker.touch()
    print(f"seeded {trajectories:,} trajectories in {time.perf_counter() - started:.0f} s: {path}")
    return url


def _ruler(store: TrajectoryStore) -> Ruler:
    # Never asked: the judge's round only reads the store (its groups are all judged).
    judge = LitellmJudge("openai/judge", base_url="http://127.0.0.1:9/v1")
    return Ruler(judge, store, RulerSettings(rubric=DEFAULT_RUBRIC))


async def _timed(read: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """The first read's milliseconds, and the median of the steady ones after it."""
    started = time.perf_counter()
    await read()
    first = (time.perf_counter() - started) * 1000
    steady = []
    for _ in range(STEADY_READS):
        started = time.perf_counter()
        await read()
        steady.append((time.perf_counter() - started) * 1000)
    return first, statistics.median(steady)


async def measure(url: str) -> dict[str, tuple[float, float]]:
    async with TrajectoryStore.opened(url, writer=False) as store:
        judge = GroupJudge(_ruler(store), Readiness(GROUP_SIZE, 0.0))
        poll = JudgedSince()

        async def trainer_poll() -> None:
            started = utcnow()
            since = poll.since()
            groups = await store.trainable_groups(
                RUN, source="judgment", limit=1000, full_size=GROUP_SIZE, judged_since=since
            )
            poll.read(started, groups, full=since is None)

        async def round_() -> None:
            assert await judge.ready_groups() == []

        dashboard = DashboardQueries(store.engine)
        return {
            "judge round, nothing new": await _timed(round_),
            "trainer poll": await _timed(trainer_poll),
            "dashboard first page": await _timed(lambda: dashboard.group_page(GroupFilter())),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(size) for size in SIZES))
    parser.add_argument(
        "--store-dir", type=Path, default=Path(tempfile.gettempdir()) / "art-proxy-store-reads"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    args.store_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for size in sizes:
        url = asyncio.run(seeded(args.store_dir, size))
        results[size] = asyncio.run(measure(url))
    reads = list(next(iter(results.values())))
    header = "".join(f"{size:>24,}" for size in sizes)
    print(f"\n{'ms (first / steady)':<28}{header}")
    for read in reads:
        cells = "".join(f"{results[s][read][0]:>15.1f} / {results[s][read][1]:5.1f}" for s in sizes)
        print(f"{read:<28}{cells}")
    largest = sizes[-1]
    steady = {read: results[largest][read][1] for read in reads}
    verdict = "met" if max(steady.values()) < TARGET_MS else "missed"
    figures = ", ".join(f"{read} {ms:.1f} ms" for read, ms in steady.items())
    print(
        f"at {largest:,} trajectories, steady: {figures} (target < {TARGET_MS:.0f} ms: {verdict})"
    )


if __name__ == "__main__":
    main()
