"""`GET /metrics` of the servers that speak vLLM's API (local-llm, the fake): vLLM's own request
metrics under vLLM's names, so one dashboard reads either: prompt and generation tokens, time to
first token, end-to-end latency, and the requests running, labelled by `model_name` (the base
model or the adapter the request named)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from art_proxy.vllm_api.engine import ChoiceDelta, ChoiceOutput, Generation

# vLLM's buckets for both (vllm/v1/metrics/loggers.py), seconds.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ["model_name"]
        self._prompt = Counter(
            "vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=self.registry
        )
        self._generation = Counter(
            "vllm:generation_tokens", "Generation tokens processed.", labels, registry=self.registry
        )
        self._first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self._latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._running = Gauge(
            "vllm:num_requests_running", "Requests being answered.", labels, registry=self.registry
        )

    def metered(self, generation: Generation, model: str, prompt_tokens: int) -> Generation:
        """`generation`, observed as it is read: its tokens, its first token, its end."""
        return _Metered(generation, self, model, prompt_tokens)

    async def scrape(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class _Metered:
    def __init__(
        self, inner: Generation, metrics: ServerMetrics, model: str, prompt_tokens: int
    ) -> None:
        self._inner = inner
        self._metrics = metrics
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._started = time.perf_counter()
        self._first_seen = False
        self._ended = False
        metrics._running.labels(model).inc()

    @property
    def choices(self) -> int:
        return self._inner.choices

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        tokens = 0
        try:
            async for delta in self._inner.deltas():
                if delta.token_ids:
                    self._first_token()
                tokens += len(delta.token_ids)
                yield delta
        finally:
            self._end(tokens)

    async def collect(self) -> list[ChoiceOutput]:
        try:
            choices = await self._inner.collect()
        except BaseException:
            self._end(0)
            raise
        self._first_token()  # a whole answer's first token reaches the client with its last
        self._end(sum(len(choice.token_ids) for choice in choices))
        return choices

    def cancel(self) -> None:
        self._end(0)
        self._inner.cancel()

    def _first_token(self) -> None:
        if not self._first_seen:
            self._first_seen = True
            elapsed = time.perf_counter() - self._started
            self._metrics._first_token.labels(self._model).observe(elapsed)

    def _end(self, generated: int) -> None:
        if self._ended:
            return
        self._ended = True
        metrics, model = self._metrics, self._model
        metrics._running.labels(model).dec()
        metrics._prompt.labels(model).inc(self._prompt_tokens)
        metrics._generation.labels(model).inc(generated)
        metrics._latency.labels(model).observe(time.perf_counter() - self._started)
