"""What a running proxy is made of, as the application holds it (`app[PARTS]`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from art_proxy.config import ProxySettings
from art_proxy.journal.ingester import Ingester
from art_proxy.journal.segments import Journal
from art_proxy.privacy.pii import PiiRedactor
from art_proxy.store.trajectory_store import TrajectoryStore

from .admin import Admin
from .aliases import Aliases
from .counters import Counters
from .lookups import Lookups
from .relay import Relay
from .tracker import TrajectoryTracker
from .upstream import Upstreams


@dataclass
class ProxyParts:
    settings: ProxySettings
    store: TrajectoryStore
    tracker: TrajectoryTracker
    counters: Counters
    relay: Relay
    lookups: Lookups
    admin: Admin
    aliases: Aliases
    journal: Journal | None = None
    ingester: Ingester | None = None
    redactor: PiiRedactor | None = None  # personal data kept off the dashboard (--redact-pii)
    upstreams: Upstreams | None = None  # asked by /ready

    async def settled(self, timeout_s: float | None = None) -> None:
        """Return once every call recorded so far is in the store (at once with no journal);
        `TimeoutError` after `timeout_s`."""
        if self.journal is not None:
            await asyncio.wait_for(self.journal.settled(), timeout_s)


PARTS = web.AppKey("parts", ProxyParts)
