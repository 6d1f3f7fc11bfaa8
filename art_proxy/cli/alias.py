"""`art-proxy alias list | history | set | reset`: the stable names agents call, what they serve,
and every move with its evidence."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from art_proxy.cli.options import command_group, settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import (
    AliasHistorySettings,
    AliasListSettings,
    AliasResetSettings,
    AliasSetSettings,
)
from art_proxy.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from art_proxy.records import AliasMove, AliasRecord, AliasRequest


def register(app: typer.Typer) -> None:
    alias_app = command_group(
        app,
        "alias",
        "List, set and reset model aliases: the stable names agents call, and what they serve.",
    )
    settings_command(
        alias_app,
        "list",
        AliasListSettings,
        "Every alias and what it serves.",
    )(alias_list)
    settings_command(
        alias_app,
        "history",
        AliasHistorySettings,
        "Each move of the aliases, newest first: what served, why it moved, and the evidence.",
    )(alias_history)
    settings_command(
        alias_app,
        "set",
        AliasSetSettings,
        "Point an alias at a model the upstreams serve (the base, or an adapter they have loaded).",
    )(alias_set)
    settings_command(
        alias_app,
        "reset",
        AliasResetSettings,
        "Point an alias back at the base model the upstream serves (after a demo, or a bad run).",
    )(alias_reset)


def alias_list(settings: AliasListSettings) -> None:
    from art_proxy.store.trajectory_store import TrajectoryStore

    async def read() -> list[AliasRecord]:
        async with TrajectoryStore.opened(settings.store, writer=False, existing=True) as store:
            return await store.aliases()

    try:
        records = asyncio.run(read())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    if not records:
        stderr.print("no aliases: agents' model names go to the upstream as they are")
        return
    # Plain lines, not a table: names are what a user copies, and a table would cut or fold them.
    for record in records:
        step = "" if record.step is None else f", step {record.step}"
        canary = ""
        if record.canary is not None:
            canary = f"; canary {record.canary} on {record.canary_fraction:.0%} of new trajectories"
        print(
            f"{record.alias} -> {record.model}{step} (since {record.updated_at:%Y-%m-%d %H:%M} "
            f"UTC){canary}"
        )


def alias_history(settings: AliasHistorySettings) -> None:
    from art_proxy.store.trajectory_store import TrajectoryStore

    async def read() -> list[AliasMove]:
        async with TrajectoryStore.opened(settings.store, writer=False, existing=True) as store:
            return await store.alias_moves(settings.alias, limit=settings.limit)

    try:
        moves = asyncio.run(read())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    if not moves:
        which = f"alias {settings.alias!r} has" if settings.alias else "no alias has"
        stderr.print(f"{which} never moved" if settings.alias else "no alias has moved yet")
        return
    for move in moves:
        where = f"{move.previous} -> {move.model}" if move.previous else move.model
        if move.reason == "canary":
            where = f"canary {move.model} beside {move.previous}"
        evidence = f": {move.note}" if move.note else ""
        print(f"{move.moved_at:%Y-%m-%d %H:%M:%S} {move.alias} {move.reason} {where}{evidence}")


def alias_set(settings: AliasSetSettings) -> None:
    from art_proxy.records import AliasRequest

    request = AliasRequest(model=settings.model, step=settings.step, note=settings.note)
    _move_alias(settings.store, settings.alias, request)


def alias_reset(settings: AliasResetSettings) -> None:
    from art_proxy.records import AliasRequest

    try:
        base = asyncio.run(_base_model(settings))
    except ConfigError as exc:
        fail(str(exc))
    request = AliasRequest(model=base, note="reset to the base model")
    _move_alias(settings.store, settings.alias, request)


async def _base_model(settings: AliasResetSettings) -> str:
    """The base model the first upstream serves; ConfigError when it cannot say which."""
    from art_proxy.proxy.aliases import base_model_of
    from art_proxy.proxy.upstream import Upstreams
    from art_proxy.proxy.upstream_models import served_models

    upstream = settings.upstream[0]
    async with Upstreams(
        [upstream], api_key=settings.upstream_api_key, timeout_s=30.0
    ) as upstreams:
        served = await served_models(upstreams, upstream)
    if isinstance(served, str):
        raise ConfigError(
            f"cannot ask the upstream for its base model ({served}): pass --upstream, or name "
            f"the model with: art-proxy alias set {settings.alias} MODEL"
        )
    base = base_model_of(settings.alias, [served])
    if base is not None:
        return base
    raise ConfigError(
        f"upstream {upstream} serves {len(served.bases)} base models "
        f"({', '.join(served.bases) or 'none'}): name one with: "
        f"art-proxy alias set {settings.alias} MODEL"
    )


def _move_alias(store_url: str, alias: str, request: AliasRequest) -> None:
    from art_proxy.store.trajectory_store import TrajectoryStore

    async def move() -> AliasMove:
        async with TrajectoryStore.opened(store_url, writer=False) as store:
            return await store.set_alias(alias, request)

    try:
        moved = asyncio.run(move())
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    was = f" (was {escape(moved.previous)})" if moved.previous else ""
    stderr.print(
        f"alias {escape(alias)} now serves {escape(moved.model)}{was}; "
        "running proxies follow within a second",
        highlight=False,
    )
