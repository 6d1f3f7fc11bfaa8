"""Secrets never reach the store, the logs or the dashboard: what counts as one, and its removal.

Headers are never stored at all. What a client sends in a body is stored, so a body is scrubbed
before it is: the value of a key that names a credential (`api_key`, `Authorization`, `password`,
... at any depth, e.g. `extra_headers.Authorization`) becomes `[redacted]` whatever it is, and so
does any string that looks like a bearer token or a provider key (`Bearer ...`, `sk-...`,
`hf_...`, ...) wherever it appears, message text included. Upstream error texts are scrubbed the
same way (some APIs echo part of a wrong key), and credentials in an upstream URL are kept out of
everything shown or stored (`redact_url`).

Scrubbing costs one orjson dump and one regex search when there is nothing to scrub, which is
every call of a well-behaved agent; only a hit walks the value.
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

Value = TypeVar("Value")


def scrub(value: Value) -> Value:
    """`value` (a JSON value) with every secret redacted; `value` itself when it holds none."""
    if not _SUSPECT_RE.search(orjson.dumps(value)):
        return value
    scrubbed: Value = _walk(value)
    return scrubbed


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
