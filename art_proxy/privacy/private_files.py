"""Files that hold what users said are their owner's alone: created 0600 (directories 0700), as
the journal's segments are. The SQLite store is created so before SQLite opens it, and SQLite
gives its `-wal` and `-shm` files the database's own mode; the records set aside beside the
journal and what `export` writes are created so too. A file that exists already keeps the mode
its operator gave it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any, Literal, overload

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def create_private(path: Path) -> None:
    """Create `path` empty, 0600, unless it exists."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))


@overload
def open_private(path: Path | str, mode: Literal["w", "a"]) -> IO[str]: ...
@overload
def open_private(path: Path | str, mode: Literal["wb", "ab"]) -> IO[bytes]: ...
def open_private(path: Path | str, mode: str) -> IO[Any]:
    """`open(path, mode)`, a file it creates made 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, FILE_MODE), mode)


def make_private(tree: Path) -> None:
    """Make `tree` (a file, or a directory and all below it) its owner's alone."""
    if tree.is_dir():
        tree.chmod(DIRECTORY_MODE)
        for root, directories, files in os.walk(tree):
            for name in directories:
                (Path(root) / name).chmod(DIRECTORY_MODE)
            for name in files:
                (Path(root) / name).chmod(FILE_MODE)
    else:
        tree.chmod(FILE_MODE)
