"""Erasure with lineage: `POST /art/v1/forget` and `art-proxy forget` delete every record of a
user, tenant or trajectory, and first say which training steps and adapters learned from them.

A real proxy records alice's and bob's conversations (one group holds both) in front of the fake
vLLM, over SQLite and PostgreSQL, its journal in the test's directory; the group is judged (the
judge's reason quotes alice) and trained on by two steps of one run. Afterwards a full-text search
of every table of the store, every file of the journal directory and the judge's cache (the
judgments) finds nothing of alice, and bob's records are whole.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
import pytest
import sqlalchemy as sa

from art_proxy.journal import rejected
from art_proxy.journal.entries import encode
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import (
    FeedbackRequest,
    Judgment,
    SubjectSelector,
    TrainingStep,
    TrajectoryScore,
)
from art_proxy.store import schema
from art_proxy.store.rows import Row, RowKind
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch
from art_proxy.testing.fake_config import FakeVllmConfig
from art_proxy.testing.fake_vllm import FakeVllm, running_fake_vllm
from art_proxy.testing.fault_tcp import faulty_tcp
from tests.conftest import proxy_settings
from tests.proxy_load import until
from tests.store_rows import call_row, group_row, scenario_row, trajectory_row

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ALICE = "ALICE-7731"  # in everything alice says
BOB = "BOB-2208"


def forget_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "forget", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def converse(proxy: RunningProxy, user: str, marker: str, group: str) -> None:
    """Two turns of `user`'s conversation, in the explicit group `group`."""
    headers = {"X-Art-User": user, "X-Art-Tenant": "acme", "X-Art-Group": group}
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers=headers
    ) as client:
        messages = await first_turn(client, marker)
        await client.chat.completions.create(model=MODEL, messages=messages)


async def first_turn(client: openai.AsyncOpenAI, marker: str) -> list[Any]:
    """The first call of a conversation that says `marker`; the messages of its second."""
    messages: list[Any] = [{"role": "user", "content": f"my card is {marker}"}]
    reply = await client.chat.completions.create(model=MODEL, messages=messages)
    return [
        *messages,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": f"and my phone is {marker}"},
    ]


def shared_judgment(ids: dict[str, str]) -> Judgment:
    """A judgment of group `shared` (its members `ids`, by user) that quotes alice."""
    scores = [
        TrajectoryScore(trajectory_id=tid, label=f"t{i}", score=0.5, explanation="", reward=0.5)
        for i, tid in enumerate(ids.values())
    ]
    return Judgment(
        id="j-shared",
        group_id="shared",
        judge_model="judge",
        mode="json",
        rubric_hash="r",
        cache_key="k-shared",
        status="scored",
        reason=f"t0 read back {ALICE} correctly",
        trajectory_ids=list(ids.values()),
        scores=scores,
        attempts=1,
        created_at=utcnow(),
    )


async def recorded_and_trained(proxy: RunningProxy) -> dict[str, str]:
    """alice and bob side by side in group `shared`, alice alone in `alone`; the shared group
    judged and trained on at step 1 of run `r1`, which saves adapters at steps 1 and 2."""
    await converse(proxy, "alice", ALICE, "shared")
    await converse(proxy, "bob", BOB, "shared")
    await converse(proxy, "alice", ALICE + "-again", "alone")
    await proxy.parts.settled()
    store = proxy.parts.store
    ids = {t.user_id or "": t.id for t in await store.trajectories(group="shared")}
    await store.add_feedback(FeedbackRequest(trajectory_id=ids["alice"], comment=f"{ALICE} ok"))
    assert await store.add_judgment(shared_judgment(ids))
    for number, groups in ((1, {"shared": "trained"}), (2, {})):
        await store.record_step(
            TrainingStep(
                run="r1",
                step=number,
                status="applied",
                adapter=f"agent@{number}-r1",
                groups=groups,
                created_at=utcnow(),
            )
        )
    return ids


async def store_text(store: TrajectoryStore) -> str:
    """Every row of every table, as text."""
    text = []
    async with store.engine.connect() as connection:
        for table in schema.metadata.sorted_tables:
            text += [repr(row) for row in (await connection.execute(sa.select(table))).all()]
    return "\n".join(text)


def sqlite_files(store_url: str) -> bytes:
    """What the files of a SQLite store hold, its write-ahead log's included (none elsewhere)."""
    if not store_url.startswith("sqlite"):
        return b""
    database = store_url.removeprefix("sqlite:///")
    paths = (Path(database + suffix) for suffix in ("", "-wal"))
    return b"".join(path.read_bytes() for path in paths if path.exists())


def journal_text(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())


async def test_forget_a_user_through_the_proxy_erases_everything_and_names_what_learned(
    store_url: str, vllm: FakeVllm, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    journal = tmp_path / "journal"
    settings = proxy_settings(store_url, vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy:
        ids = await recorded_and_trained(proxy)
        # Damaged journal bytes a recovery quarantined: one holds a piece of alice's record.
        (journal / "quarantine").mkdir()
        (journal / "quarantine" / "0-alice.bytes").write_text(f'{ids["alice"]}","my card is ')
        (journal / "quarantine" / "0-bob.bytes").write_text(f'{ids["bob"]}", "my card')
        async with http.get(f"{proxy.root_url}/art/v1/lineage?user=alice") as response:
            lineage = await response.json()
        async with http.post(f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}) as done:
            assert done.status == 200, await done.text()
            erased = await done.json()
        store = proxy.parts.store
        text = await store_text(store)
        on_disk = journal_text(journal)
        # What the files of a SQLite store hold, the write-ahead log's included, while it runs.
        raw = sqlite_files(store_url)
        bob = await store.trajectory(ids["bob"])
        judgments = await store.judgments(group="shared")
        steps = await store.training_steps("r1")
        feedback = await store.feedback([ids["alice"], ids["bob"]])

    assert len(lineage["trajectories"]) == 2 and "shared" in lineage["groups"]
    [learned] = lineage["steps"]
    assert (learned["run"], learned["step"], learned["groups"]) == ("r1", 1, {"shared": "trained"})
    assert lineage["derived_adapters"] == ["agent@1-r1", "agent@2-r1"]
    assert erased["lineage"] == lineage
    assert erased["deleted"]["trajectories"] == 2 and erased["deleted"]["calls"] == 4
    assert erased["deleted"]["judgments"] == 1 and erased["deleted"]["feedback"] == 1
    assert ALICE not in text and "alice" not in text
    assert ALICE.encode() not in on_disk and ids["alice"].encode() not in on_disk
    assert erased["quarantined_files_dropped"] == 1
    assert (journal / "quarantine" / "0-bob.bytes").exists()
    assert ALICE.encode() not in raw
    # bob keeps his records; the consumed group and the steps stay, as lineage.
    assert bob is not None and bob.calls is not None and len(bob.calls) == 2
    assert BOB in text and judgments == [] and feedback == {}
    assert [s.step for s in steps] == [1, 2] and steps[0].groups == {"shared": "trained"}


async def test_forget_by_cli_asks_for_yes_refuses_beside_a_running_proxy_and_drops_set_aside(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    store_args = ("--store", sqlite_url, "--journal", str(journal))
    async with running_proxy(
        proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    ) as proxy:
        await recorded_and_trained(proxy)
        beside = await asyncio.to_thread(forget_cli, *store_args, "--user", "alice", "--yes")
        # A record of alice's the store refused, set aside beside the journal, and one of bob's.
        for user, marker in (("alice", ALICE + "-refused"), ("bob", BOB + "-refused")):
            row = cast(Row, {"id": f"t-{user}", "user_id": user, "marker": marker})
            rejected.set_aside(journal, encode(Batch([(RowKind.trajectory, row)])))
    dry = await asyncio.to_thread(forget_cli, *store_args, "--tenant", "acme")
    done = await asyncio.to_thread(forget_cli, *store_args, "--user", "alice", "--yes")
    after = await TrajectoryStore.open(sqlite_url, writer=False)
    try:
        text = await store_text(after)
    finally:
        await after.aclose()
    left_aside = [r.payload for r in rejected.read(journal)]

    assert beside.returncode == 1
    assert "a proxy is running with the journal" in beside.stderr
    assert "Traceback" not in beside.stderr
    assert dry.returncode == 0, dry.stderr
    assert "tenant 'acme': 3 trajectories in 2 groups" in dry.stdout
    assert "agent@1-r1, agent@2-r1" in dry.stdout
    assert "pass --yes to delete them" in dry.stderr
    assert done.returncode == 0, done.stderr
    assert "user 'alice': 2 trajectories" in done.stdout
    assert "deleted 2 trajectories, 4 calls, 1 feedback, 1 judgments" in done.stderr
    assert "1 set-aside journal records dropped" in done.stderr
    assert ALICE not in text and BOB in text
    assert len(left_aside) == 1 and BOB.encode() in left_aside[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "pass exactly one of --user, --tenant and --trajectory"),
        (("--user", "a", "--tenant", "b"), "pass exactly one of --user, --tenant and --trajectory"),
    ],
)
def test_forget_without_exactly_one_subject_is_a_one_line_error(
    args: tuple[str, ...], message: str, sqlite_url: str
) -> None:
    result = forget_cli("--store", sqlite_url, *args)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr


async def test_forgetting_a_trajectory_takes_its_best_of_candidates_and_shadow_samples(
    store: TrajectoryStore,
) -> None:
    at = utcnow()
    served = trajectory_row("served", "s", "g", at)
    copies = [
        trajectory_row(
            "candidate", "s", "g-best", at, finished_at=at,
            finish_reason="best_of", metadata={"best_of": "served"},
        ),
        trajectory_row(
            "shadow", "s", "g", at, finished_at=at,
            finish_reason="shadow", metadata={"shadow_of": "served"},
        ),
        trajectory_row(  # someone else's shadow
            "another", "s", "g", at, finished_at=at,
            finish_reason="shadow", metadata={"shadow_of": "other"},
        ),
    ]  # fmt: skip
    rows = [scenario_row("s", at), group_row("g", "s", at), group_row("g-best", "s", at), served]
    rows += [
        *copies,
        *(call_row(t, at, request={"said": ALICE}) for t in ("served", "candidate", "shadow")),
    ]
    await store.write(Batch(rows))

    erased = await store.forget(SubjectSelector(trajectory="served"))

    assert erased.lineage.trajectories == ["candidate", "served", "shadow"]
    assert ALICE not in await store_text(store)
    assert await store.trajectory("another") is not None


async def test_a_user_is_erased_by_the_id_the_client_sent_whatever_it_holds(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Body ids the store cannot keep as they are (a tab, over 200 characters) are kept hashed,
    and padding is stripped as a header's is: erasure by the id as sent finds each."""
    sent = ["  padded\t", "tab\tbed", "x" * 300]
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        for user in sent:
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"{ALICE} {user!r}"}], user=user
            )
    await proxy.parts.settled()
    erased = []
    for user in sent:
        async with http.post(f"{proxy.root_url}/art/v1/forget", json={"user": user}) as response:
            assert response.status == 200, await response.text()
            erased.append((await response.json())["deleted"]["trajectories"])
    assert erased == [1, 1, 1]
    assert ALICE not in await store_text(proxy.parts.store)


async def test_a_named_call_going_on_from_an_anonymous_conversation_is_erased_with_its_user(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """It does not join the anonymous trajectory, which keeps no subject and so no erasure
    finds: it opens its own, under its user."""
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as anonymous:
        messages = await first_turn(anonymous, "hello")
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-User": "alice"}
    ) as alice:
        await alice.chat.completions.create(model=MODEL, messages=messages)
    await proxy.parts.settled()
    async with http.post(f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}) as response:
        assert (await response.json())["deleted"]["trajectories"] == 1
    text = await store_text(proxy.parts.store)
    assert "my card is hello" in text and "and my phone is hello" not in text


async def test_a_call_refused_for_one_bad_subject_header_is_erased_with_the_rest_of_its_subject(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The refused body is recorded (what the client sent), under what of its subject can be
    read: before, one bad header threw the valid user away and kept the words under no one."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"my card {ALICE}"}]}
    for headers in ({"X-Art-User": "alice", "X-Art-Tenant": " "}, {"X-Art-Tenant": "\t"}):
        sent = {**body, "user": "alice"} if "X-Art-User" not in headers else body
        async with http.post(f"{proxy.base_url}/chat/completions", json=sent, headers=headers) as r:
            assert r.status == 400
    await proxy.parts.settled()
    async with http.post(f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}) as response:
        assert (await response.json())["deleted"]["trajectories"] == 2
    assert ALICE not in await store_text(proxy.parts.store)


async def test_a_call_in_flight_during_the_erasure_is_not_recorded_after_it(
    store_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """alice's second call is answered after the erasure's 200: its record is dropped on arrival
    (before: it failed the foreign key and was set aside with her words). Her new conversation,
    begun after the erasure, is recorded as any."""
    journal = tmp_path / "journal"
    async with running_fake_vllm(FakeVllmConfig(delay_s=1.5)) as slow:
        settings = proxy_settings(store_url, slow.base_url, journal=str(journal))
        async with running_proxy(settings) as proxy:
            headers = {"X-Art-User": "alice"}
            async with openai.AsyncOpenAI(
                base_url=proxy.base_url, api_key="unused", default_headers=headers
            ) as client:
                messages = await first_turn(client, ALICE)
                await proxy.parts.settled()
                in_flight = asyncio.create_task(
                    client.chat.completions.create(model=MODEL, messages=messages)
                )
                await until(lambda: len(slow.requests) == 2, 10, "the second call upstream")
                async with http.post(
                    f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}
                ) as done:
                    assert done.status == 200, await done.text()
                assert not in_flight.done()
                answered = await in_flight
                await proxy.parts.settled()
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hello again"}]
                )
            await proxy.parts.settled()
            store = proxy.parts.store
            text = await store_text(store)
            back = await store.trajectories(user="alice")
            dropped = store.writer.erased_on_arrival
    # (A journal left empty removes its directory.)
    set_aside = [record.payload for record in rejected.read(journal)] if journal.exists() else []

    assert answered.choices[0].message.content
    assert ALICE not in text and (
        not journal.exists() or ALICE.encode() not in journal_text(journal)
    )
    assert set_aside == [] and dropped == 1
    assert len(back) == 1 and "hello again" in text


@pytest.mark.postgres
async def test_a_judgment_of_a_group_whose_member_was_erased_while_it_was_judged_is_not_stored(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The judge read alice's and bob's group, then alice was erased: what it says of her (its
    reason and explanations quote the conversations) is not stored; the group stays unjudged."""
    await converse(proxy, "alice", ALICE, "shared")
    await converse(proxy, "bob", BOB, "shared")
    await proxy.parts.settled()
    store = proxy.parts.store
    ids = {t.user_id or "": t.id for t in await store.trajectories(group="shared")}
    async with http.post(f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}) as done:
        assert done.status == 200, await done.text()

    assert not await store.add_judgment(shared_judgment(ids))
    assert await store.judgments(group="shared") == []
    assert ALICE not in await store_text(store)


async def test_a_conversation_opened_during_the_erasure_and_continued_after_is_not_set_aside(
    sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Its first call, in flight during the erasure, is dropped on arrival with its trajectory's
    row; her next turn continues the trajectory the proxy still holds, which the store never
    got: refused there, it was set aside in rejected-records with her words, where no erasure
    reached them. A call of an erased trajectory is dropped instead."""
    journal = tmp_path / "journal"
    async with running_fake_vllm(FakeVllmConfig(delay_s=1.5)) as slow:
        settings = proxy_settings(sqlite_url, slow.base_url, journal=str(journal))
        async with running_proxy(settings) as proxy:
            async with openai.AsyncOpenAI(
                base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-User": "alice"}
            ) as client:
                first = asyncio.create_task(first_turn(client, ALICE))
                await until(lambda: len(slow.requests) == 1, 10, "the first call upstream")
                async with http.post(
                    f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}
                ) as done:
                    assert done.status == 200, await done.text()
                messages = await first
                await proxy.parts.settled()
                await client.chat.completions.create(model=MODEL, messages=messages)
            await proxy.parts.settled()
            assert ALICE not in await store_text(proxy.parts.store)
            assert proxy.parts.store.writer.erased_on_arrival == 2
            assert proxy.parts.ingester is not None and proxy.parts.ingester.state.rejected == 0
            # ... nor kept in the journal's live segment, the proxy running on.
            assert ALICE.encode() not in journal_text(journal)


async def test_a_shadow_sample_of_a_call_answered_after_the_erasure_is_not_recorded(
    sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A shadow sample is drawn once the served call is answered, after the erasure here: it
    holds her words from before it, so it is dropped as her served call is."""
    async with running_fake_vllm(FakeVllmConfig(delay_s=1.5)) as slow:
        settings = proxy_settings(
            sqlite_url,
            slow.base_url,
            journal=str(tmp_path / "journal"),
            shadow_fraction=1.0,
            shadow_samples=1,
        )
        async with running_proxy(settings) as proxy:
            headers = {"X-Art-User": "alice", "X-Art-Split": "prod"}
            async with openai.AsyncOpenAI(
                base_url=proxy.base_url, api_key="unused", default_headers=headers
            ) as client:
                served = asyncio.create_task(
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"my card {ALICE}"}]
                    )
                )
                await until(lambda: len(slow.requests) == 1, 10, "the served call upstream")
                async with http.post(
                    f"{proxy.root_url}/art/v1/forget", json={"user": "alice"}
                ) as done:
                    assert done.status == 200, await done.text()
                await served
                await until(lambda: proxy.parts.counters.shadow_samples == 1, 20, "the sample")
            await proxy.parts.settled()
            assert ALICE not in await store_text(proxy.parts.store)
            assert await proxy.parts.store.trajectories(user="alice") == []


async def test_another_proxys_backlog_of_an_erased_user_is_dropped_when_it_arrives(
    postgres_url: str, vllm: FakeVllm, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Proxy B, cut off from the store, journals alice's calls; proxy A erases alice (200); B's
    store comes back and B catches up: none of alice's records lands (before: all 3 did)."""
    async with faulty_tcp("127.0.0.1", 5432) as relay:
        cut_off = postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{relay.port}")
        settings_a = proxy_settings(postgres_url, vllm.base_url, journal=str(tmp_path / "a"))
        settings_b = proxy_settings(cut_off, vllm.base_url, journal=str(tmp_path / "b"))
        async with running_proxy(settings_a) as a, running_proxy(settings_b) as b:
            await converse(a, "alice", ALICE, "before")
            await a.parts.settled()
            await relay.refuse()
            for group in ("b1", "b2", "b3"):
                await converse(b, "alice", ALICE + "-" + group, group)
            assert b.parts.journal is not None and b.parts.journal.backlog_frames == 6
            async with http.post(f"{a.root_url}/art/v1/forget", json={"user": "alice"}) as done:
                assert done.status == 200, await done.text()
                assert (await done.json())["deleted"]["trajectories"] == 1
            await relay.restore()
            await asyncio.wait_for(b.parts.settled(), timeout=60)
            text = await store_text(a.parts.store)
            dropped = b.parts.store.writer.erased_on_arrival
    assert ALICE not in text
    assert dropped == 6


async def test_a_record_set_aside_before_the_erasure_is_dropped_by_replay_and_a_later_one_lands(
    store: TrajectoryStore, tmp_path: Path
) -> None:
    """`journal replay` of alice's records set aside before her erasure (in a journal the
    erasure did not see) drops them, her later calls too; a conversation she begins afterwards
    is recorded."""

    def conversation(trajectory: str, at: datetime) -> list[Batch]:
        kind, row = trajectory_row(trajectory, "s-" + trajectory, "g-" + trajectory, at)
        first = [
            scenario_row("s-" + trajectory, at),
            group_row("g-" + trajectory, "s-" + trajectory, at),
            (kind, cast(Row, {**row, "user_id": "alice"})),
            call_row(trajectory, at, request={"said": ALICE}),
        ]
        return [Batch(first), Batch([call_row(trajectory, at, seq=1, request={"said": ALICE})])]

    for batch in conversation("before", utcnow()):
        rejected.set_aside(tmp_path, encode(batch))
    await store.forget(SubjectSelector(user="alice"))
    replayed = await rejected.replay(tmp_path, store)
    for batch in conversation("after", utcnow()):
        await store.write(batch)

    assert replayed.landed == 2 and replayed.refused == [] and rejected.read(tmp_path) == []
    assert await store.trajectory("before") is None
    assert [t.id for t in await store.trajectories(user="alice")] == ["after"]
    assert store.writer.erased_on_arrival == 2
