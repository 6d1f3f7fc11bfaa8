"""What a request gets back from the engine: a handle that yields each choice's new tokens.

The engine thread hands a step's output to the request's event loop with `call_soon_threadsafe`;
the handle turns it into an async stream. Cancelling the handle (a client that went away) tells the
engine to drop the request's rows at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from art_proxy.vllm_api.engine import ChoiceDelta, ChoiceOutput, EngineFailure


class Generation:
    """The engine's side of `vllm_api.engine.Generation`: deltas of one id each, text detokenized."""

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
        by_choice: list[list[ChoiceDelta]] = [[] for _ in range(self.choices)]
        async for delta in self.deltas():
            by_choice[delta.index].append(delta)
        return [_joined(deltas) for deltas in by_choice]

    # -- engine thread -----------------------------------------------------------------------

    def deliver(self, item: list[ChoiceDelta] | EngineFailure) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            self.cancelled = True


def _joined(deltas: list[ChoiceDelta]) -> ChoiceOutput:
    last = deltas[-1]
    assert last.finish_reason is not None  # `deltas` ends once every choice has finished
    return ChoiceOutput(
        token_ids=tuple(token_id for delta in deltas for token_id in delta.token_ids),
        logprobs=tuple(logprob for delta in deltas for logprob in delta.logprobs),
        text="".join(delta.text or "" for delta in deltas),
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        prompt_logprobs=deltas[0].prompt_logprobs,
    )
