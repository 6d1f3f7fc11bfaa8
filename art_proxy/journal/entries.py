"""A journal entry: one recorded call's rows (a store `Batch`) as the payload of one frame.

JSON through orjson, which writes datetimes as ISO 8601; `TIME_FIELDS` says which to read back.
Every entry holds exactly one call row, whose id makes ingestion idempotent (writer.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import orjson

from art_proxy.store.rows import TIME_FIELDS, Batch, Row, RowKind


@dataclass(frozen=True)
class Entry:
    appended_at: float  # wall-clock seconds, for the backlog's age
    batch: Batch


def encode(batch: Batch) -> bytes:
    """The payload of `batch`'s frame; orjson's `TypeError` for a value it cannot write."""
    rows = [(int(kind), row) for kind, row in batch.rows]
    return orjson.dumps({"at": time.time(), "rows": rows})


def decode(payload: bytes) -> Entry:
    """An entry back from its payload; `ValueError` (orjson's, a KeyError's) if it is not one."""
    try:
        parsed = orjson.loads(payload)
        rows: list[tuple[RowKind, Row]] = []
        for kind_number, row in parsed["rows"]:
            kind = RowKind(kind_number)
            for name in TIME_FIELDS[kind]:
                value = row.get(name)
                if value is not None:
                    row[name] = datetime.fromisoformat(value)
            rows.append((kind, cast(Row, row)))
        return Entry(float(parsed["at"]), Batch(rows))
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"not a journal entry: {exc}") from exc
