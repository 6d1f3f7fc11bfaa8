"""Secrets never reach the store, the logs or the dashboard: what counts as one, and its removal.

Headers are never stored at all. What a client sends in a body is stored, so a body is scrubbed
before it is: the value of a key that names a credential (`api_key`, `Authorization`, `password`,
... at any depth, e.g. `extra_headers.Authorization`) becomes `[redacted]` whatever it is, and so
does any string that looks like a bearer token or a provider key (`Bearer ...`, `sk-...`,
`hf_...`, ...) wherever it appears, message text included. Upstream error texts are scrubbed the
same way (some APIs echo part of a wrong key), and credentials in an upstream URL are kept out of
everything shown or stored (`redact_url`).

Scrubbing costs an orjson dump of each part of a body (a message, a tool) and a search for a few
literal pieces in the parts not seen before, when there is nothing to scrub, which is every call of
a well-behaved agent; only a hit runs the regex, and only its hit walks the value.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import orjson

REDACTED = "[redacted]"

# Keys (case and -/_ aside) whose value is a credential wherever they appear.
_SECRET_KEY = (
    r"(?:(?:x|proxy)[-_])?(?:api[-_]?key|authorization)|[a-z]+[-_]api[-_]key|"
    r"(?:access|refresh|id|auth|bearer)[-_]?token|password|passwd|(?:client[-_])?secret|"
    r"cookie|set[-_]cookie"
)
_SECRET_KEY_RE = re.compile(rf"^(?:{_SECRET_KEY})$", re.IGNORECASE)
# Strings that are credentials by their look: a bearer token, and the prefixes providers give their
# keys (OpenAI and Anthropic sk-, Hugging Face, GitHub, Slack, AWS access keys, Google API keys).
# Case matters and a digit is required where prose could match ("bearer instruments", "task-list").
_TOKEN = (
    r"\b(?:[Bb]earer\s+(?=[A-Za-z0-9._~+/=-]*\d)[A-Za-z0-9._~+/=-]{12,}|"
    r"sk-(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
    r"AIza[0-9A-Za-z_-]{35})"
)
_TOKEN_RE = re.compile(_TOKEN)
# One pass over a value's JSON: a secret key (as a JSON key) or a token anywhere.
_SUSPECT_RE = re.compile(rf'"(?i:{_SECRET_KEY})"\s*:|{_TOKEN}'.encode())
# Pieces of which any text `_SUSPECT_RE` matches holds at least one: how each `_SECRET_KEY` ends
# (with the key's closing quote) and how each `_TOKEN` starts, in lowercase, looked for in the
# lowercased JSON (a few more texts are suspected so, never fewer). The regex runs only after a
# hit: its case-insensitive alternatives cost 36 ns a byte (10 us for a small request, more than
# anything else the proxy does with it). The pieces are looked for in one pass, as one
# alternation: an `in` search for each of the 19 took 19 passes (measured: 5.8 against 0.6 us for
# a 36-byte message, 15 against 11 us for a 726-byte answer; 30 against 20 us for a new call's
# record). tests/test_redaction.py holds an example of every kind of secret.
_PIECES = (
    *(b'key"', b'authorization"', b'token"', b'password"', b'passwd"', b'secret"', b'cookie"'),
    *(b"earer", b"sk-", b"hf_", b"github_pat_", b"xox", b"akia", b"aiza"),
    *(b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"),
)
_PIECES_RE = re.compile(b"|".join(re.escape(piece) for piece in _PIECES))

Value = TypeVar("Value")


# Parts of bodies found free of secrets, by the hash of their JSON: an agent sends its whole
# conversation and its tools again with every call, and searching them again each time cost about
# 10 ns a byte (200 us for a 21 KB conversation); a part seen before costs its hash (about 1 ns a
# byte). Python's hash of bytes is keyed per process (SipHash), so no body can be made to collide
# with a part found clean. Bounded: emptied when full.
_CLEAN_PARTS_MAX = 65_536
_clean_parts: set[int] = set()


def scrub(value: Value) -> Value:
    """`value` (a JSON value) with every secret redacted; `value` itself when it holds none."""
    if not _holds_suspect(value):
        return value
    scrubbed: Value = _walk(value)
    return scrubbed


def _holds_suspect(value: Any) -> bool:
    """Whether `value` may hold a secret: a key that names one at its top level, or a part that
    looks like one. The parts are its items, and the items of its lists (messages, tools)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _SECRET_KEY_RE.match(key):
                return True
            if isinstance(item, list):
                if any(map(_part_suspect, item)):
                    return True
            elif _part_suspect(item):
                return True
        return False
    if isinstance(value, list):
        return any(map(_part_suspect, value))
    return _part_suspect(value)


def _part_suspect(part: Any) -> bool:
    if part is None or isinstance(part, (bool, int, float)):
        return False
    dumped = orjson.dumps(part)
    known = hash(dumped)
    if known in _clean_parts:
        return False
    if _may_hold_secret(dumped) and _SUSPECT_RE.search(dumped):
        return True
    if len(_clean_parts) >= _CLEAN_PARTS_MAX:
        _clean_parts.clear()
    _clean_parts.add(known)
    return False


def _may_hold_secret(dumped: bytes) -> bool:
    return _PIECES_RE.search(dumped.lower()) is not None


def scrub_text(text: str) -> str:
    return _TOKEN_RE.sub(REDACTED, text)


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: REDACTED if _SECRET_KEY_RE.match(key) else _walk(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_walk(item) for item in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


def redact_url(url: str) -> str:
    """`url` without the user and password it may carry (`http://u:p@host/v1` -> `http://host/v1`)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
