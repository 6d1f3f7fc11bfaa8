"""The proxy's `/art/v1` API as the simulation's app backend uses it, answers parsed into records."""

from __future__ import annotations

from typing import Any

import aiohttp

from art_proxy.records import (
    AliasMove,
    AliasRecord,
    AliasRequest,
    FeedbackRequest,
    FinishRequest,
    TrainingStep,
    TrajectoryRecord,
)

_PAGE = 1000  # the proxy's largest page


class ApiError(Exception):
    """The proxy refused a request; the message holds its answer."""


class ArtApi:
    def __init__(self, http: aiohttp.ClientSession, proxy_root: str) -> None:
        self._http = http
        self.root = proxy_root

    async def trajectories(self, **filters: str) -> list[TrajectoryRecord]:
        """Newest first: `trajectories(split="prod", status="open")`, `(group=...)`."""
        body = await self._json("GET", "/art/v1/trajectories", params={**filters, "limit": _PAGE})
        return [TrajectoryRecord.model_validate(item) for item in body["data"]]

    async def trajectory(self, trajectory_id: str) -> TrajectoryRecord:
        """With its calls."""
        body = await self._json("GET", f"/art/v1/trajectories/{trajectory_id}")
        return TrajectoryRecord.model_validate(body)

    async def finish(self, trajectory_id: str, request: FinishRequest) -> None:
        await self._json("POST", f"/art/v1/trajectories/{trajectory_id}/finish", request)

    async def feedback(self, request: FeedbackRequest) -> None:
        await self._json("POST", "/art/v1/feedback", request)

    async def move_alias(self, alias: str, request: AliasRequest) -> None:
        await self._json("PUT", f"/art/v1/aliases/{alias}", request)

    async def alias_target(self, alias: str) -> str | None:
        body = await self._json("GET", "/art/v1/aliases")
        records = [AliasRecord.model_validate(item) for item in body["data"]]
        return next((r.model for r in records if r.alias == alias), None)

    async def alias_moves(self, alias: str) -> list[AliasMove]:
        """Oldest first."""
        body = await self._json("GET", "/art/v1/alias_moves", params={"alias": alias})
        return [AliasMove.model_validate(item) for item in reversed(body["data"])]

    async def training_steps(self, run: str) -> list[TrainingStep]:
        """Oldest first."""
        body = await self._json("GET", "/art/v1/training_steps", params={"run": run})
        return [TrainingStep.model_validate(item) for item in body["data"]]

    async def health(self) -> dict[str, Any]:
        health: dict[str, Any] = await self._json("GET", "/health")
        return health

    async def _json(
        self,
        method: str,
        path: str,
        body: FinishRequest | FeedbackRequest | AliasRequest | None = None,
        params: dict[str, str | int] | None = None,
    ) -> Any:
        payload = None if body is None else body.model_dump(mode="json", exclude_unset=True)
        async with self._http.request(
            method, self.root + path, json=payload, params=params
        ) as response:
            if response.status != 200:
                raise ApiError(f"{method} {path}: HTTP {response.status}: {await response.text()}")
            return await response.json()
