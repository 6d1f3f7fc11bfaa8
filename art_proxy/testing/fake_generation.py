"""The fake's generations: every choice made whole before the answer, then streamed in chunks.

A stream cuts each choice into chunks of `tokens_per_chunk` ids and the choices take turns, one
chunk each, the way parallel sequences leave vLLM's engine. `chunk_delay_s` waits before each
chunk; `fail_mid_stream` fails the stream after its first chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from art_proxy.testing.fake_config import FakeVllmConfig
from art_proxy.vllm_api.engine import ChoiceDelta, ChoiceOutput, EngineFailure

# What ids[start:end] of choice `index` say in a stream: the text (None: held back) and the
# tool-call fragments they complete.
Saying = Callable[[int, int, int], tuple[str | None, tuple[dict[str, Any], ...]]]


class FakeGeneration:
    def __init__(self, outputs: list[ChoiceOutput], config: FakeVllmConfig, saying: Saying) -> None:
        self.choices = len(outputs)
        self._outputs = outputs
        self._config = config
        self._saying = saying

    async def collect(self) -> list[ChoiceOutput]:
        return self._outputs

    def cancel(self) -> None:
        """Nothing to stop: the answer was made before it was sent."""

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        config, outputs, saying = self._config, self._outputs, self._saying
        delay_s, fail = config.chunk_delay_s, config.fail_mid_stream
        bounds = [chunks_of(len(output.token_ids), config.tokens_per_chunk) for output in outputs]
        for step in range(max(len(choice_bounds) for choice_bounds in bounds)):
            for index, (output, choice_bounds) in enumerate(zip(outputs, bounds, strict=True)):
                if step >= len(choice_bounds):
                    continue
                if delay_s:
                    await asyncio.sleep(delay_s)
                start, end = choice_bounds[step]
                last = step == len(choice_bounds) - 1
                text, tool_calls = saying(index, start, end)
                yield ChoiceDelta(
                    index,
                    output.token_ids[start:end],
                    output.logprobs[start:end],
                    text,
                    output.finish_reason if last else None,
                    None,
                    tool_calls,
                )
                if fail:
                    raise EngineFailure(
                        "Injected failure in the middle of the stream (fail_mid_stream)."
                    )


def chunks_of(length: int, size: int) -> list[tuple[int, int]]:
    """[start, end) bounds of the stream chunks for `length` ids; an empty output still ends once."""
    return [(start, min(start + size, length)) for start in range(0, length, size)] or [(0, 0)]
