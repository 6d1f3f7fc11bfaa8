"""What each upstream serves (`GET /v1/models`): checked at start, then watched for aliases.

At start a base URL that is not an OpenAI API (no `/v1`, so `/models` is a 404) stops the proxy
with one line naming the likely fix; an upstream that does not answer yet is a warning (vLLM may
still be loading). Then every `WATCH_PERIOD_S` the aliases are checked against the answers, so an
alias whose adapter the upstream no longer holds (it restarted, another run unloaded it) falls back
to the base model instead of failing every call with 404 (aliases.py).
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from art_proxy.errors import ArtProxyError, ConfigError
from art_proxy.store.trajectory_store import utcnow

from .aliases import Aliases, ServedModels
from .upstream import Upstreams, read_body

log = logging.getLogger(__name__)

WATCH_PERIOD_S = 15.0


async def served_models(upstreams: Upstreams, upstream: str) -> ServedModels | str:
    """What `upstream` serves, or why it could not say (a line)."""
    try:
        response = await upstreams.get(upstream, "/models", None)
        raw = await read_body(upstream, response)
    except ArtProxyError as exc:
        return exc.message
    if response.status != 200:
        return f"GET {upstream}/models answered {response.status}"
    try:
        entries = orjson.loads(raw).get("data", [])
        names = frozenset(str(entry["id"]) for entry in entries)
        bases = tuple(str(e["id"]) for e in entries if e.get("parent") is None)
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return f"GET {upstream}/models answered something that is no model list"
    return ServedModels(names, bases)


async def check_upstreams(upstreams: Upstreams) -> dict[str, ServedModels]:
    """The start-up check: raises ConfigError for a base URL that is no OpenAI API; warns of one
    that does not answer; what the others serve."""
    served: dict[str, ServedModels] = {}
    for upstream in upstreams.urls:
        answer = await served_models(upstreams, upstream)
        if isinstance(answer, ServedModels):
            served[upstream] = answer
        elif answer.endswith("answered 404") and not upstream.endswith("/v1"):
            raise ConfigError(
                f"upstream {upstream} has no /models: an OpenAI-compatible base URL ends in /v1 "
                f"(--upstream {upstream}/v1)"
            )
        else:
            log.warning(
                "upstream %s does not answer yet (%s): its calls fail until it does",
                upstream,
                answer,
            )
    return served


async def watch_aliases(upstreams: Upstreams, aliases: Aliases) -> None:
    """Check the aliases against what the upstreams serve, every `WATCH_PERIOD_S`, for ever
    (the start-up check did the first)."""
    while True:
        await asyncio.sleep(WATCH_PERIOD_S)
        try:
            await check_aliases(upstreams, aliases)
        except Exception:  # the watch must outlive any surprise; the next round tries again
            log.exception("checking the aliases against the upstreams failed")


async def check_aliases(upstreams: Upstreams, aliases: Aliases) -> None:
    asked_at = utcnow()
    answers = [await served_models(upstreams, upstream) for upstream in upstreams.urls]
    served = [answer for answer in answers if isinstance(answer, ServedModels)]
    if len(served) == len(answers):  # an upstream that does not answer tells nothing
        aliases.check_served(served, asked_at)
