"""Whether a call is recorded at all: the operator's `--record` policy and the caller's consent.

A caller says `X-Art-Record: on` or `off` per request (an application that knows its user opted
out, or in). Under `--record all` a call is recorded unless it says `off`; under `consented` only
when it says `on`; under `none` never. A call that is not recorded is forwarded and answered as any
other, but nothing of it is kept: no trajectory, no record, no journal frame, no trace span, no
shadow sample, and no line in the log beyond what the proxy logs of every request. `off` always
wins: no policy records a call whose caller refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from art_proxy.config import RecordPolicy
from art_proxy.errors import BadRequest

RECORD_HEADER = "X-Art-Record"
_ANSWERS = {"on": True, "off": False}


def records_call(policy: RecordPolicy, headers: Mapping[str, str]) -> bool:
    """Whether the call with `headers` is recorded; `BadRequest` for an `X-Art-Record` that is
    neither `on` nor `off` (guessing would record a call someone meant to keep out)."""
    said = headers.get(RECORD_HEADER)
    consent = None
    if said is not None:
        consent = _ANSWERS.get(said.strip().lower())
        if consent is None:
            raise BadRequest(f"{RECORD_HEADER} must be on or off, not {said[:40]!r}")
    if consent is False or policy is RecordPolicy.none:
        return False
    return consent is True or policy is RecordPolicy.all
