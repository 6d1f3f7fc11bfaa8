"""Recorded calls built by hand, the way the proxy stores them."""

from __future__ import annotations

from datetime import UTC, datetime

from art_proxy.records import CallRecord, CallStatus


def call(
    seq: int,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float],
    *,
    trajectory_id: str = "t1",
    status: CallStatus = "ok",
) -> CallRecord:
    ok = status == "ok"
    return CallRecord(
        id=f"{trajectory_id}-c{seq}",
        trajectory_id=trajectory_id,
        seq=seq,
        kind="chat",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        latency_ms=1.0,
        upstream="http://upstream",
        status=status,
        http_status=200 if ok else 502,
        stream=False,
        model="m",
        request={},
        response={} if ok else None,
        sampling={},
        prompt_token_ids=prompt if ok else None,
        completion_token_ids=[completion] if ok else None,
        logprobs=[logprobs] if ok else None,
        trainable=ok,
        stitched=seq > 0,
        attribution="url",
    )
