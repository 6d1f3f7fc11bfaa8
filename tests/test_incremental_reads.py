"""Reads that do not grow with the store: a watching judge's round and the trainer's poll start
where the last one left off, yet find every group that becomes ready or judged, a late one too.

On SQLite and PostgreSQL. The judge's passes run against groups recorded as the proxy records
them (tests/ruler/recorded.py); the trainer's polls against judged groups (tests/test_training_store.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from art_proxy.ruler import run
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import GroupJudge, Readiness
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy_trainer.sidecar import JudgedSince
from tests.ruler.recorded import answered, record_group
from tests.test_training_store import add_group, judgment

TWO = [answered("Paris"), answered("Lyon")]


def group_judge(store: TrajectoryStore) -> GroupJudge:
    ruler = Ruler(
        LitellmJudge("openai/judge", base_url="http://127.0.0.1:9/v1"),
        store,
        RulerSettings(rubric=DEFAULT_RUBRIC),
    )
    return GroupJudge(ruler, Readiness(group_size=2, wait=600.0))


async def mark_judged(store: TrajectoryStore, judge: GroupJudge, group_id: str) -> None:
    verdict = judgment(group_id, {})
    await store.add_judgment(
        verdict.model_copy(
            update={
                "id": f"{group_id}-judged",
                "judge_model": judge.ruler.judge_model,
                "rubric_hash": judge.ruler.rubric_hash,
            }
        )
    )


async def test_a_watching_judge_reads_only_past_its_floor_and_finds_what_becomes_ready(
    store: TrajectoryStore,
) -> None:
    judge = group_judge(store)
    old, _ = await record_group(store, TWO, started_ago_s=7200)
    filling, _ = await record_group(store, TWO, finished=[True, False], started_ago_s=3600)
    first = await judge.ready_groups()
    assert [group.id for group in first] == [old]
    assert set(judge.waiting) == {filling}
    await mark_judged(store, judge, old)

    newer, _ = await record_group(store, TWO, started_ago_s=60)
    # The floor stays at the group still filling: it and what came after are read again.
    assert [group.id for group in await judge.ready_groups()] == [newer]
    assert set(judge.waiting) == {filling}


async def test_a_group_that_arrives_late_behind_the_floor_is_found_by_the_next_full_pass(
    store: TrajectoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge = group_judge(store)
    judged, _ = await record_group(store, TWO, started_ago_s=60)
    assert [group.id for group in await judge.ready_groups()] == [judged]
    await mark_judged(store, judge, judged)
    # A journal's backlog, ingested late: a group that started before the floor.
    late, _ = await record_group(store, TWO, started_ago_s=7200)
    assert await judge.ready_groups() == []  # a steady round reads past the floor only
    monkeypatch.setattr(run, "FULL_PASS_S", 0.0)
    assert [group.id for group in await judge.ready_groups()] == [late]


async def test_the_trainers_poll_reads_what_was_judged_lately_and_what_it_left(
    store: TrajectoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    poll = JudgedSince()

    async def polled() -> list[str]:
        started = utcnow()
        since = poll.since()
        groups = await store.trainable_groups("run", source="judgment", judged_since=since)
        poll.read(started, groups, full=since is None)
        return [group.group_id for group in groups]

    for name in ("a", "b"):
        ids = await add_group(store, name, 2, age=-120)
        await store.add_judgment(judgment(name, dict(zip(ids, [0.0, 1.0], strict=True))))
    assert await polled() == ["a", "b"]  # the first poll reads every group
    [a] = [
        group
        for group in await store.trainable_groups("run", source="judgment")
        if group.group_id == "a"
    ]
    poll.consumed([a])  # "b" is left for later: read again until taken
    assert poll.since() is not None
    ids = await add_group(store, "c", 2, age=-1)
    await store.add_judgment(judgment("c", dict(zip(ids, [0.2, 0.9], strict=True))))
    assert await polled() == ["a", "b", "c"]  # "a" is not consumed in the store: still offered

    # A judgment from long ago that no poll read (an earlier run's): found by the full poll.
    ids = await add_group(store, "old", 2, age=-600)
    old = judgment("old", dict(zip(ids, [0.1, 0.8], strict=True)), age=-600)
    await store.add_judgment(old.model_copy(update={"created_at": utcnow() - timedelta(hours=5)}))
    assert "old" not in await polled()
    monkeypatch.setattr(JudgedSince, "FULL_POLL_S", 0.0)
    assert "old" in await polled()
