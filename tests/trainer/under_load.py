"""The trainer's whole loop while an agent keeps calling the alias it moves (the swap tests)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console

from art_proxy.config import TrainSettings
from art_proxy_trainer.command import TrainSummary, run_train
from tests.trainer.agents import untagged
from tests.wire_client import steady_load


@dataclass
class UnderLoad:
    summary: TrainSummary
    # The model that answered each call, in order (adapters without their run's tag).
    served: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # every answer that was not a 200


async def train_under_load(
    settings: TrainSettings, *, proxy_base_url: str, model: str, last: str, pause_s: float = 0.0
) -> UnderLoad:
    """Train while calling `model` through the proxy, until the calls are served by `last` (the
    last step's adapter: its move happens as training ends, so the load is given time to see it)."""
    served: list[str] = []
    failures: list[str] = []
    async with aiohttp.ClientSession() as http:
        load = asyncio.create_task(
            steady_load(http, proxy_base_url, model, served, failures, pause_s=pause_s)
        )
        try:
            summary = await run_train(settings, Console(quiet=True))
            for _ in range(100):
                if last in map(untagged, served):
                    break
                await asyncio.sleep(0.05)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    return UnderLoad(summary, [untagged(model) for model in served], failures)
