"""Ids of the records a proxy makes on its hot path (calls, trajectories, groups).

128 random bits as 32 hex digits, as `uuid.uuid4().hex` gives, from the same source (the OS's
random generator), read 4 KiB at a time: where system calls are dear (a sandboxed kernel), one
`urandom` per id cost 16 us, and a call takes up to three ids.
"""

from __future__ import annotations

import os
import threading

_BATCH_BYTES = 4096
_ID_BYTES = 16

_lock = threading.Lock()
_random = b""
_offset = 0


def new_id() -> str:
    global _random, _offset
    with _lock:
        if _offset + _ID_BYTES > len(_random):
            _random, _offset = os.urandom(_BATCH_BYTES), 0
        start = _offset
        _offset += _ID_BYTES
        return _random[start:_offset].hex()
