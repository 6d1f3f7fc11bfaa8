"""The journal's quarantine: damaged bytes a recovery copied aside (segments.py), erased and aged
like every other place a user's words are kept.

A damaged span cannot be decoded, so it cannot be told whose it is by its rows: erasure deletes
each file that holds any of the subject's ids (a trajectory id, the user or tenant id as stored),
and retention deletes files older than the retention.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

QUARANTINE = "quarantine"


def drop_naming(directory: Path, names: Collection[str]) -> int:
    """Delete the quarantined files of `directory` that hold any of `names`; how many went."""
    needles = [name.encode() for name in names if name]
    return _drop(directory, lambda path: any(n in path.read_bytes() for n in needles))


def drop_older(directory: Path, before: float) -> int:
    """Delete the quarantined files written before `before` (epoch seconds); how many went."""
    return _drop(directory, lambda path: path.stat().st_mtime < before)


def _drop(directory: Path, chosen: Callable[[Path], bool]) -> int:
    folder = directory / QUARANTINE
    if not folder.is_dir():
        return 0
    dropped = 0
    for path in sorted(folder.iterdir()):
        if path.is_file() and chosen(path):
            path.unlink(missing_ok=True)
            dropped += 1
    return dropped
