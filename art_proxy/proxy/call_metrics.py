"""Per served model, what a gateway operator reads off `/metrics`: tokens in and out, how long a
call took to its last byte and, streamed, to its first chunk.

Observed as each answered call is recorded (recording.py) and read by `/metrics`' collector
(metrics.py). Labelled by the model that served (an alias's target: an adapter) and the alias
the client asked for (empty when it named a model): both are names the proxy's aliases or the
upstream accepted, never a client's free text, so the series stay as few as the adapters served.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric

# Model calls take seconds to minutes; a first chunk, tens of milliseconds to seconds.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class CallMetrics:
    def __init__(self) -> None:
        labels = ["model", "alias"]
        self._prompt = Counter(
            "art_proxy_prompt_tokens", "Prompt tokens of answered calls.", labels, registry=None
        )
        self._completion = Counter(
            "art_proxy_completion_tokens",
            "Completion tokens of answered calls.",
            labels,
            registry=None,
        )
        self._seconds = Histogram(
            "art_proxy_call_seconds",
            "Seconds from a call's arrival to the upstream's last byte.",
            labels,
            buckets=CALL_BUCKETS,
            registry=None,
        )
        self._first_chunk = Histogram(
            "art_proxy_time_to_first_chunk_seconds",
            "Seconds from a streamed call's arrival to the upstream's first chunk.",
            labels,
            buckets=CALL_BUCKETS,
            registry=None,
        )

    def observe(
        self,
        model: str,
        alias: str,
        usage: Mapping[str, Any] | None,
        seconds: float,
        first_chunk_s: float | None,
    ) -> None:
        """One answered call: its `usage` (the upstream's), its time, a stream's first chunk."""
        labels = (model, alias)
        if usage:
            for counter, field in (
                (self._prompt, "prompt_tokens"),
                (self._completion, "completion_tokens"),
            ):
                tokens = usage.get(field)
                if isinstance(tokens, int) and tokens >= 0:
                    counter.labels(*labels).inc(tokens)
        self._seconds.labels(*labels).observe(seconds)
        if first_chunk_s is not None:
            self._first_chunk.labels(*labels).observe(first_chunk_s)

    def collect(self) -> Iterator[Metric]:
        for metric in (self._prompt, self._completion, self._seconds, self._first_chunk):
            yield from metric.collect()
