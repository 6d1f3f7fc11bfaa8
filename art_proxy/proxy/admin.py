"""`/art/v1`: reading trajectories back and finishing them (admin key when one is set)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from art_proxy.errors import BadRequest, NotFound
from art_proxy.records import FinishRequest
from art_proxy.store.trajectory_store import TrajectoryStore

from .tracker import TrajectoryTracker

_MAX_PAGE = 1000


def json_response(payload: BaseModel | Sequence[BaseModel]) -> web.Response:
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json().encode()
    else:
        items = b",".join(item.model_dump_json().encode() for item in payload)
        body = b'{"object":"list","data":[' + items + b"]}"
    return web.Response(body=body, content_type="application/json")


class Admin:
    def __init__(self, store: TrajectoryStore, tracker: TrajectoryTracker) -> None:
        self._store = store
        self._tracker = tracker

    async def trajectories(self, request: web.Request) -> web.Response:
        query = request.query
        limit, offset = _paging(request)
        found = await self._store.trajectories(
            scenario=query.get("scenario"),
            status=query.get("status"),
            split=query.get("split"),
            group=query.get("group"),
            limit=limit,
            offset=offset,
        )
        return json_response(found)

    async def trajectory(self, request: web.Request) -> web.Response:
        trajectory_id = request.match_info["trajectory"]
        found = await self._store.trajectory(trajectory_id)
        if found is None:
            raise NotFound(f"no trajectory {trajectory_id!r}", param="trajectory")
        return json_response(found)

    async def finish(self, request: web.Request) -> web.Response:
        trajectory_id = request.match_info["trajectory"]
        raw = await request.read()
        try:
            finish = FinishRequest.model_validate(orjson.loads(raw) if raw.strip() else {})
        except (orjson.JSONDecodeError, ValidationError) as exc:
            raise BadRequest(f"invalid finish body: {exc}") from exc
        finished = await self._store.finish(trajectory_id, finish)
        if finished is None:
            raise NotFound(f"no trajectory {trajectory_id!r}", param="trajectory")
        self._tracker.forget([trajectory_id])
        return json_response(finished)

    async def groups(self, request: web.Request) -> web.Response:
        limit, offset = _paging(request)
        found = await self._store.groups(
            scenario=request.query.get("scenario"), limit=limit, offset=offset
        )
        return json_response(found)

    async def scenarios(self, request: web.Request) -> web.Response:
        return json_response(await self._store.scenarios())


def _paging(request: web.Request) -> tuple[int, int]:
    try:
        limit = int(request.query.get("limit", "100"))
        offset = int(request.query.get("offset", "0"))
    except ValueError as exc:
        raise BadRequest("limit and offset must be integers") from exc
    if not 1 <= limit <= _MAX_PAGE or offset < 0:
        raise BadRequest(f"limit must be 1..{_MAX_PAGE} and offset >= 0")
    return limit, offset
