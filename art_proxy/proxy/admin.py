"""`/art/v1`: reading trajectories back, finishing them, users' feedback on them, moving model
aliases, reading the trainer's steps, erasing a subject and its lineage (admin key when one is set)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from art_proxy.errors import BadRequest, NotFound, StoreUnavailable
from art_proxy.journal.segments import Journal
from art_proxy.privacy.erasure import forget
from art_proxy.privacy.pii import (
    PiiRedactor,
    redacted_judgment,
    redacted_scenario,
    redacted_trajectory,
)
from art_proxy.records import (
    AliasRequest,
    FeedbackRequest,
    FinishRequest,
    Lease,
    SubjectSelector,
)
from art_proxy.records.erasure import stored_subject_id
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .aliases import Aliases
from .lease_publisher import FRESH
from .request_body import MAX_DEPTH, within_depth
from .tracker import TrajectoryTracker

_MAX_PAGE = 1000
# How long `forget` waits for this proxy's journaled calls to reach the store.
FORGET_SETTLE_TIMEOUT_S = 30.0
_MAX_NAME = 200  # the store's aliases.alias
_MAX_OFFSET = 2**63 - 1  # the stores' largest integer (SQLite's and PostgreSQL's bigint)


def json_response(payload: BaseModel | Sequence[BaseModel]) -> web.Response:
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json().encode()
    else:
        items = b",".join(item.model_dump_json().encode() for item in payload)
        body = b'{"object":"list","data":[' + items + b"]}"
    return web.Response(body=body, content_type="application/json")


class Admin:
    def __init__(
        self,
        store: TrajectoryStore,
        tracker: TrajectoryTracker,
        aliases: Aliases,
        journal: Journal | None = None,
        redactor: PiiRedactor | None = None,
        proxy_id: str | None = None,
    ) -> None:
        self._store = store
        self._proxy_id = proxy_id  # what this proxy publishes its leases as (lease_publisher.py)
        self._tracker = tracker
        self._aliases = aliases
        self._journal = journal
        # --redact-pii: what these routes show of recorded text is redacted, as on the dashboard.
        self._redactor = redactor

    async def forget(self, request: web.Request) -> web.Response:
        """`POST /art/v1/forget`: delete a subject's records (privacy/erasure.py), once every call this
        proxy journaled is in the store; 503, nothing deleted, while the store does not take them."""
        subject = await _body(request, SubjectSelector, "forget")
        if self._journal is not None:
            try:
                await asyncio.wait_for(self._journal.settled(), FORGET_SETTLE_TIMEOUT_S)
            except TimeoutError as exc:
                raise StoreUnavailable(
                    "calls this proxy journaled are not in the store yet (is it down?): "
                    "nothing was deleted; try again once it takes them"
                ) from exc
        erased = await forget(
            self._store,
            subject,
            self._journal.directory if self._journal is not None else None,
            self._journal,
        )
        self._tracker.forget(erased.lineage.trajectories)
        return json_response(erased)

    async def lineage(self, request: web.Request) -> web.Response:
        """`GET /art/v1/lineage?trajectory=|user=|tenant=`: what learned from a subject."""
        query = request.query
        try:
            subject = SubjectSelector.model_validate(
                {name: query[name] for name in ("user", "tenant", "trajectory") if name in query}
            )
        except ValidationError as exc:
            raise BadRequest(f"invalid lineage query: {exc}") from exc
        return json_response(await self._store.lineage(subject))

    async def trajectories(self, request: web.Request) -> web.Response:
        query = request.query
        limit, offset = _paging(request)
        found = await self._store.trajectories(
            scenario=query.get("scenario"),
            status=query.get("status"),
            split=query.get("split"),
            group=query.get("group"),
            user=_subject_id(query.get("user")),
            tenant=_subject_id(query.get("tenant")),
            limit=limit,
            offset=offset,
        )
        if self._redactor is not None:
            placeholders = self._redactor.placeholders()
            found = [redacted_trajectory(trajectory, placeholders) for trajectory in found]
        return json_response(found)

    async def trajectory(self, request: web.Request) -> web.Response:
        trajectory_id = request.match_info["trajectory"]
        found = await self._store.trajectory(trajectory_id)
        if found is None:
            raise NotFound(f"no trajectory {trajectory_id!r}", param="trajectory")
        if self._redactor is not None:
            found = await asyncio.to_thread(
                redacted_trajectory, found, self._redactor.placeholders()
            )
        return json_response(found)

    async def finish(self, request: web.Request) -> web.Response:
        trajectory_id = request.match_info["trajectory"]
        finish = await _body(request, FinishRequest, "finish", empty_ok=True)
        finished = await self._store.finish(trajectory_id, finish)
        if finished is None:
            raise NotFound(f"no trajectory {trajectory_id!r}", param="trajectory")
        self._tracker.forget([trajectory_id])
        return json_response(finished)

    async def add_feedback(self, request: web.Request) -> web.Response:
        feedback = await _body(request, FeedbackRequest, "feedback")
        stored = await self._store.add_feedback(feedback)
        if stored is None:
            raise NotFound(f"no trajectory {feedback.trajectory_id!r}", param="trajectory_id")
        return json_response(stored)

    async def trajectory_feedback(self, request: web.Request) -> web.Response:
        trajectory_id = request.match_info["trajectory"]
        if await self._store.trajectory(trajectory_id, with_calls=False) is None:
            raise NotFound(f"no trajectory {trajectory_id!r}", param="trajectory")
        found = await self._store.feedback([trajectory_id])
        return json_response(found.get(trajectory_id, []))

    async def groups(self, request: web.Request) -> web.Response:
        limit, offset = _paging(request)
        found = await self._store.groups(
            scenario=request.query.get("scenario"), limit=limit, offset=offset
        )
        return json_response(found)

    async def scenarios(self, request: web.Request) -> web.Response:
        found = await self._store.scenarios()
        if self._redactor is not None:
            placeholders = self._redactor.placeholders()
            found = [redacted_scenario(scenario, placeholders) for scenario in found]
        return json_response(found)

    async def aliases(self, request: web.Request) -> web.Response:
        return json_response(await self._store.aliases())

    async def leases(self, request: web.Request) -> web.Response:
        """The models open trajectories hold: the trainer unloads none of them. The store's
        (every proxy's recorded calls, and what every proxy published of its memory's leases,
        lease_publisher.py) and this proxy's memory, which knows a lease whose first call is
        still running or still in the journal before any publication does."""
        since = utcnow() - FRESH
        recorded = await self._store.leases(since, but_proxy=self._proxy_id)
        held = {lease.model: lease.trajectories for lease in recorded}
        for model, count in self._tracker.held_leases().items():
            held[model] = max(held.get(model, 0), count)
        return json_response([Lease(model=m, trajectories=n) for m, n in sorted(held.items())])

    async def set_alias(self, request: web.Request) -> web.Response:
        """Move an alias; the trainer calls it once every upstream has loaded the adapter."""
        alias = request.match_info["alias"]
        if len(alias) > _MAX_NAME or not alias.isprintable():
            raise BadRequest(f"alias must be printable and at most {_MAX_NAME} characters")
        move = await _body(request, AliasRequest, "alias")
        return json_response(await self._aliases.move(alias, move))

    async def alias_moves(self, request: web.Request) -> web.Response:
        limit, _ = _paging(request)
        found = await self._store.alias_moves(request.query.get("alias"), limit=limit)
        return json_response(found)

    async def judgments(self, request: web.Request) -> web.Response:
        """RULER's judgments, newest first: each trajectory's score and the judge's explanation."""
        limit, _ = _paging(request)
        found = await self._store.judgments(group=request.query.get("group"), limit=limit)
        if self._redactor is not None:
            placeholders = self._redactor.placeholders()
            found = [redacted_judgment(judgment, placeholders) for judgment in found]
        return json_response(found)

    async def training_steps(self, request: web.Request) -> web.Response:
        limit, _ = _paging(request, default_limit=_MAX_PAGE)
        return json_response(await self._store.training_steps(request.query.get("run"), limit))


RequestModel = TypeVar("RequestModel", bound=BaseModel)


async def _body(
    request: web.Request, model: type[RequestModel], what: str, *, empty_ok: bool = False
) -> RequestModel:
    """The request's JSON body as `model`; a 400 naming `what` when it is not one."""
    raw = await request.read()
    try:
        parsed = {} if empty_ok and not raw.strip() else orjson.loads(raw)
        if not within_depth(parsed, MAX_DEPTH):
            raise BadRequest(f"invalid {what} body: nested deeper than {MAX_DEPTH} levels")
        holding = _holding_nul(parsed)
        if holding is not None:
            raise BadRequest(f"invalid {what} body: {holding} holds a NUL character", param=holding)
        return model.model_validate(parsed)
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadRequest(f"invalid {what} body: {exc}") from exc


def _subject_id(value: str | None) -> str | None:
    """A user or tenant filter, by the id as the client sent it (hashed as the store keeps it)."""
    return stored_subject_id(value) if value is not None and value.strip() else value


def _holding_nul(value: object, where: str = "") -> str | None:
    """The path of a string in a JSON value that holds a NUL (the store's text cannot), if any."""
    if isinstance(value, str):
        return (where or "body") if "\x00" in value else None
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        if isinstance(key, str) and "\x00" in key:
            return f"{where}.{key!r}".lstrip(".")
        found = _holding_nul(child, f"{where}.{key}".lstrip("."))
        if found is not None:
            return found
    return None


def _paging(request: web.Request, *, default_limit: int = 100) -> tuple[int, int]:
    try:
        limit = int(request.query.get("limit", str(default_limit)))
        offset = int(request.query.get("offset", "0"))
    except ValueError as exc:
        raise BadRequest("limit and offset must be integers") from exc
    if not 1 <= limit <= _MAX_PAGE:
        raise BadRequest(f"limit must be 1..{_MAX_PAGE}", param="limit")
    if not 0 <= offset <= _MAX_OFFSET:
        raise BadRequest(f"offset must be 0..{_MAX_OFFSET}", param="offset")
    return limit, offset
