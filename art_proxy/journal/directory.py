"""A journal's directory: where it lives, which store it serves, and its slots.

Each proxy writing to the directory holds a slot (a numbered folder) by `flock` on the slot's lock
file; a slot whose lock is free belongs to a proxy that died, and the next proxy to start adopts
it. The directory's `store` file names the store its frames belong to, so that one store's records
are never ingested into another.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from art_proxy.config import JOURNAL_AUTO, JOURNAL_OFF
from art_proxy.errors import ConfigError

SEGMENT_SUFFIX = ".frames"
_STORE_FILE = "store"  # which store the journal's frames belong to
_LOCK_FILE = "lock"


@dataclass
class Slot:
    path: Path
    lock_fd: int


def journal_directory(setting: str, store: str) -> Path | None:
    """Where `--journal` puts the journal of a proxy of `store`; None when it is off."""
    if setting == JOURNAL_OFF:
        return None
    if setting != JOURNAL_AUTO:
        return Path(setting).expanduser()
    url = make_url(store)
    if url.get_backend_name() == "sqlite" and url.database:
        return Path(url.database + ".journal")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    digest = hashlib.sha256(store_name(store).encode()).hexdigest()[:16]
    return Path(state) / "art-proxy" / "journals" / digest


def store_name(store: str) -> str:
    """A store URL without its password, a SQLite file by its absolute path (`sqlite:///art.db`
    names another file in each working directory): what the journal's directory records as its
    owner."""
    url = make_url(store)
    if url.get_backend_name() == "sqlite" and url.database:
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    return url.render_as_string(hide_password=True)


def claim_for_store(directory: Path, store_url: str) -> None:
    """Frames of one store must never be ingested into another: the directory names its store.
    The name is written whole or not at all (a crash mid-write left an empty marker, which
    stopped every later start), and durably before any frame is written under it."""
    store = store_name(store_url)
    marker = directory / _STORE_FILE
    if _write_durably(marker, store + "\n", replace=False):
        return
    owner = marker.read_text(encoding="utf-8", errors="replace").strip()
    try:
        named = store_name(owner)
    except ArgumentError:
        named = None
    if named is None:
        raise ConfigError(
            f"journal {directory}: its store file {marker} is unreadable ({owner[:80]!r}); if "
            f"this journal's records belong to {store}, write that line into it (or delete "
            "the file) and start again"
        )
    if owner != store and named == store:
        # Written before SQLite files were named by their absolute path, from this directory.
        _write_durably(marker, store + "\n", replace=True)
        return
    if owner != store:
        raise ConfigError(
            f"journal {directory} holds records of store {owner}, not {store}: give this proxy "
            "its own --journal"
        )


def _write_durably(path: Path, text: str, *, replace: bool) -> bool:
    """`text` in `path`, whole: a temporary file synced, then linked (`replace` False: only where
    `path` does not exist yet, two proxies starting at once) or renamed into place, and the
    directory synced. Whether `path` now holds `text`."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with open(partial, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    try:
        if replace:
            os.replace(partial, path)
        else:
            os.link(partial, path)
    except FileExistsError:
        return False
    finally:
        partial.unlink(missing_ok=True)
    fsync_directory(path.parent)
    return True


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _try_lock(path: Path) -> Slot | None:
    path.mkdir(exist_ok=True)
    fd = os.open(path / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return Slot(path, fd)


def take_slots(directory: Path) -> tuple[Slot, list[Slot]]:
    """The first free slot for this proxy, and every other free slot that holds segments."""
    existing = sorted(
        (path for path in directory.iterdir() if path.is_dir() and path.name.isdigit()),
        key=lambda path: int(path.name),
    )
    own: Slot | None = None
    adopted: list[Slot] = []
    for path in existing:
        slot = _try_lock(path)
        if slot is None:
            continue
        if own is None:
            own = slot
        elif any(path.glob("*" + SEGMENT_SUFFIX)):
            adopted.append(slot)
        else:
            os.close(slot.lock_fd)
    number = max((int(path.name) for path in existing), default=-1) + 1
    while own is None:
        own = _try_lock(directory / str(number))
        number += 1
    return own, adopted


def live_slots(directory: Path) -> int:
    """How many slots of `directory` a running proxy holds (their lock is taken)."""
    if not directory.is_dir():
        return 0
    held = 0
    for path in directory.iterdir():
        if path.is_dir() and path.name.isdigit() and (path / _LOCK_FILE).exists():
            slot = _try_lock(path)
            if slot is None:
                held += 1
            else:
                os.close(slot.lock_fd)
    return held


def remove_if_empty(slot: Slot) -> None:
    if any(slot.path.glob("*" + SEGMENT_SUFFIX)):
        return
    with contextlib.suppress(OSError):
        (slot.path / _LOCK_FILE).unlink()
        slot.path.rmdir()


def remove_if_unused(directory: Path) -> None:
    """Remove a directory left with no slot: nothing of it is waiting to be ingested."""
    if {path.name for path in directory.iterdir()} == {_STORE_FILE}:
        with contextlib.suppress(OSError):
            (directory / _STORE_FILE).unlink()
            directory.rmdir()


def sync_segments(rotated: list[int], directory: Path | None, live: int) -> None:
    """fdatasync each rotated-out segment, then fsync the slot's directory, then fdatasync the
    live segment; every descriptor is closed whatever fails (the first error is raised)."""
    with contextlib.ExitStack() as closing:
        for fd in [*rotated, live]:
            closing.callback(os.close, fd)
        for fd in rotated:
            os.fdatasync(fd)
        if directory is not None:
            fsync_directory(directory)
        os.fdatasync(live)


def sync_directories(directories: list[Path]) -> None:
    for directory in directories:
        fsync_directory(directory)
