"""What a request gets back from the engine: a handle that yields each choice's new tokens.

The engine thread hands a step's output to the request's event loop with `call_soon_threadsafe`;
the handle turns it into an async stream. Cancelling the handle (a client that went away) tells the
engine to drop the request's rows at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from art_proxy.local.errors import EngineFailure
from art_proxy.local.sampling import TokenLogprob

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """One step of one choice: usually one id, its logprob and the text it released."""

    index: int  # the choice's index within its request
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]  # one per id
    text: str  # may be "": a partial character, or text that might begin a stop string
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop id that ended it; None for EOS


@dataclass
class ChoiceOutput:
    """A whole choice, its deltas joined (for non-stream responses)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None


class Generation:
    def __init__(self, choices: int, loop: asyncio.AbstractEventLoop) -> None:
        self.choices = choices
        self._loop = loop
        self._queue: asyncio.Queue[list[ChoiceDelta] | EngineFailure] = asyncio.Queue()
        # Written by the event loop, read by the engine thread; a plain bool is enough for a flag.
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Every choice's deltas in production order, until all choices have finished."""
        unfinished = self.choices
        while unfinished:
            item = await self._queue.get()
            if isinstance(item, EngineFailure):
                raise item
            for delta in item:
                if delta.finish_reason is not None:
                    unfinished -= 1
                yield delta

    async def collect(self) -> list[ChoiceOutput]:
        """Every choice, whole, once all have finished; raises `EngineFailure`."""
        choices = [ChoiceOutput() for _ in range(self.choices)]
        async for delta in self.deltas():
            choice = choices[delta.index]
            choice.ids += delta.token_ids
            choice.logprobs += delta.logprobs
            choice.text += delta.text
            if delta.finish_reason is not None:
                choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_reason
        return choices

    # -- engine thread -----------------------------------------------------------------------

    def deliver(self, item: list[ChoiceDelta] | EngineFailure) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            self.cancelled = True
