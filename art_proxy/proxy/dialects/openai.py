"""OpenAI's chat and legacy completions: the dialect the upstream speaks, relayed as it is."""

from __future__ import annotations

from art_proxy.errors import ArtProxyError
from art_proxy.records import JsonObject
from art_proxy.wire import DONE, sse

from ..capture import ClientAsks, strip_chunk, strip_response


class ChatRendering:
    """The upstream's answer cut back to what the client asked for (capture.py)."""

    def __init__(self, asks: ClientAsks) -> None:
        self._asks = asks

    def whole(self, response: JsonObject) -> JsonObject:
        return strip_response(response, self._asks)

    def chunk(self, chunk: JsonObject, raw: bytes) -> bytes:
        out = strip_chunk(chunk, self._asks)
        if out is chunk:  # the client asked for all of it: the upstream's own bytes
            return b"data: " + raw + b"\n\n"
        return b"" if out is None else sse(None, out)

    def end(self, response: JsonObject | None) -> bytes:
        return DONE  # after an error event too: the OpenAI SDK waits for it

    def stream_error(self, error: ArtProxyError) -> bytes:
        return sse(None, error.body())

    def failed_answer(self, raw: bytes, status: int) -> bytes:
        return raw  # vLLM's error bodies are already OpenAI-shaped
