"""What holds users' words on disk is its owner's alone (privacy/private_files.py): the SQLite
store with its -wal, the records set aside beside the journal, and what `export` writes were
0644, readable by every account on the machine."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from art_proxy.journal import rejected
from art_proxy.proxy.server import RunningProxy
from tests.ruler.scripted_judge import running_scripted_judge
from tests.ruler.test_judge_command import judge_command
from tests.test_export import export, two_turns


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> object:
    """Most machines' umask, under which a plain `open` makes a file 0644."""
    before = os.umask(0o022)
    yield
    os.umask(before)


async def test_the_sqlite_store_and_its_wal_are_the_owners_alone(
    umask_022: object, sqlite_proxy: RunningProxy, sqlite_url: str
) -> None:
    await two_turns(sqlite_proxy, "a task of alice's", "train")
    await sqlite_proxy.parts.settled()
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    files = [p for p in (database, Path(f"{database}-wal"), Path(f"{database}-shm")) if p.exists()]
    assert Path(f"{database}-wal") in files
    assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}


@pytest.mark.parametrize("form", ["jsonl", "parquet", "hf"])
async def test_what_export_writes_is_the_owners_alone(
    umask_022: object,
    sqlite_proxy: RunningProxy,
    sqlite_url: str,
    tmp_path: Path,
    form: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """And `--format hf` leaves no Arrow copy in `datasets`' cache, where no `forget` reaches."""
    cache = tmp_path / "datasets-cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))  # the export's process inherits it
    await two_turns(sqlite_proxy, "a task of alice's", "train")
    await sqlite_proxy.parts.settled()
    out = tmp_path / f"out.{form}"
    result = await asyncio.to_thread(
        export, "--store", sqlite_url, "--format", form, "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    written = [out, *out.rglob("*")] if out.is_dir() else [out]
    assert {p.name: mode(p) for p in written} == {
        p.name: 0o700 if p.is_dir() else 0o600 for p in written
    }
    assert not [p for p in cache.rglob("*") if p.suffix == ".arrow"]


def test_records_set_aside_beside_the_journal_are_the_owners_alone(
    umask_022: object, tmp_path: Path
) -> None:
    rejected.set_aside(tmp_path, b"a record the store refused")
    assert mode(tmp_path / rejected.REJECTED_FILE) == 0o600
    rejected.drop_older(tmp_path, before=0.0)  # rewritten, as a drop or a replay does
    assert mode(tmp_path / rejected.REJECTED_FILE) == 0o600


@pytest.mark.postgres
async def test_judge_check_names_a_store_without_its_password(postgres_url: str) -> None:
    """`judge --check` on a store with nothing to check said so quoting the store's URL, its
    password with it, into a terminal and whatever log keeps the command's output."""
    with_password = postgres_url.replace("postgres@", "postgres:hunter2-secret@", 1)
    async with running_scripted_judge() as judge:
        result = await asyncio.to_thread(
            judge_command,
            "--check",
            "--store",
            with_password,
            "--judge",
            "openai/j",
            "--judge-base-url",
            judge.base_url,
        )
    assert result.returncode != 0 and "nothing to check the judge on" in result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr
