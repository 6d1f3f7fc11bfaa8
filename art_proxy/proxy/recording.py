"""Turning one finished call into rows, and saving them under the store-error policy.

A call is recorded whatever happened to it (answered, refused upstream, timed out, abandoned by the
client): a failed call is data. The response to the client waits for the record to be saved: to be
appended to the journal (which the ingester moves into the store), or with `--journal off` to be
committed to the store. That is what makes "the client saw it, so it reaches the store" hold even
if the proxy is killed right after, or the store is down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import cast

from art_proxy.config import OnStoreError
from art_proxy.errors import JournalError, StoreError, StoreUnavailable
from art_proxy.journal.entries import encode
from art_proxy.journal.segments import Journal
from art_proxy.privacy.redaction import scrub, scrub_text
from art_proxy.records import Guidance, JsonObject
from art_proxy.store.rows import Batch, CallRow, Row, RowKind, ScenarioRow, TouchRow, TrajectoryRow
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .attribution import call_keys, reply_messages
from .call import CallInProgress, Outcome
from .capture import (
    NO_TOKENS,
    sampling_of,
    strip_response,
    tokens_of,
    unreproduced_sampling,
)
from .counters import Counters
from .guidance import NOT_LOCATED, located
from .tracing import CallSpans
from .tracker import Assignment, TrajectoryTracker

log = logging.getLogger(__name__)

_REPORT_EVERY_S = 10.0  # the journal's refusals, logged at most this often


class Recorder:
    def __init__(
        self,
        store: TrajectoryStore,
        tracker: TrajectoryTracker,
        policy: OnStoreError,
        counters: Counters,
        journal: Journal | None = None,
        *,
        journaled_before_stored: Callable[[], Awaitable[bool]] | None = None,
        spans: CallSpans | None = None,
        label: Callable[[str], str] = lambda model: model,
    ) -> None:
        self._store = store
        # A model or alias name as /metrics and the spans say it (aliases.py `Aliases.label`).
        self._label = label
        self._spans = spans  # OpenTelemetry, when a collector is configured
        # Waits for the journal's records to reach the store; whether they did (app.py).
        self._journaled_before_stored = journaled_before_stored
        self._tracker = tracker
        self._policy = policy
        self.counters = counters
        self._journal = journal
        self._journal_refusals = 0  # appends the journal refused, since the last one logged
        self._journal_refusal_logged = 0.0

    async def record(self, call: CallInProgress, outcome: Outcome) -> None:
        """Commit the call; raises `StoreUnavailable` only under `--on-store-error fail`.
        A call that is not to be recorded is only counted."""
        if not call.recorded:
            self.counters.unrecorded_calls += 1
            # Counted as any answered call is on /metrics (tokens, seconds): nothing of it is
            # kept, but a gateway's figures must not miss the traffic that opted out.
            if outcome.status == "ok" and call.model is not None:
                self._observe(call, outcome, time.perf_counter() - call.started)
            return
        assignment = call.assignment
        tokens = (
            tokens_of(outcome.response, call.kind) if outcome.response is not None else NO_TOKENS
        )
        untrainable = None
        guidance = None
        if outcome.status == "ok":
            untrainable = (
                outcome.untrainable or tokens.untrainable or unreproduced_sampling(call.body)
            )
            if call.guidance is not None:
                guidance = _guidance(call, tokens.prompt_token_ids)
                untrainable = untrainable or (NOT_LOCATED if guidance is None else None)
        stitched = _stitched(tokens.prompt_token_ids, assignment.previous_sequences)
        replies, prompt_key, keys = self._continuation(call, outcome)
        now = utcnow()
        row: CallRow = {
            "id": call.id,
            "trajectory_id": assignment.trajectory_id,
            "seq": assignment.seq,
            "kind": call.kind,
            "created_at": call.created_at,
            "latency_ms": (time.perf_counter() - call.started) * 1000.0,
            "upstream": assignment.upstream,
            "status": outcome.status,
            "http_status": outcome.http_status,
            # Secrets are scrubbed on the way out (`_save`), with the other rows' text.
            "error": _text(outcome.error) if outcome.error is not None else None,
            "stream": call.stream,
            "model": _text(call.model) if call.model is not None else None,
            "request": call.body,
            # As the client received it: the ids and logprobs it did not ask for live in their
            # own fields, so the row does not carry them twice.
            "response": strip_response(outcome.response, call.asks) if outcome.response else None,
            "sampling": sampling_of(call.body),
            "prompt_token_ids": tokens.prompt_token_ids,
            "completion_token_ids": tokens.completion_token_ids,
            "logprobs": tokens.logprobs,
            "trainable": outcome.status == "ok" and untrainable is None,
            "untrainable_reason": untrainable,
            "stitched": stitched,
            "attribution": assignment.attribution,
            "continuation_key": keys[0] if keys else None,
            "dialect": call.dialect,
            "client_request": call.client_body,
            "guidance": guidance.model_dump() if guidance is not None else None,
        }
        batch = Batch([*_creation_rows(assignment, now, keys, prompt_key), (RowKind.call, row)])
        if assignment.seq > 0 or not assignment.new_rows:
            touch: TouchRow = {
                "b_id": assignment.trajectory_id,
                "b_now": now,
                "b_tip": keys[0] if keys else None,
                "b_prompt": prompt_key if keys else None,
            }
            batch = Batch([*batch.rows, (RowKind.touch, touch)])
        self.counters.calls += 1
        if outcome.status == "ok" and call.model is not None:
            self._observe(call, outcome, row["latency_ms"] / 1000.0)
        by_attribution, by_dialect = self.counters.by_attribution, self.counters.by_dialect
        by_attribution[assignment.attribution] = by_attribution.get(assignment.attribution, 0) + 1
        by_dialect[call.dialect] = by_dialect.get(call.dialect, 0) + 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s %s -> %s %d: trajectory %s call %d, %s (%s)%s",
                call.dialect,
                call.route or call.kind,
                outcome.status,
                outcome.http_status,
                assignment.trajectory_id,
                assignment.seq,
                assignment.attribution,
                assignment.reason,
                "" if stitched or assignment.seq == 0 else ", not stitched",
            )
        if self._spans is not None:
            self._spans.emit(
                row, assignment, call.created_at, utcnow(), call.trace, label=self._label
            )
        if outcome.status != "ok":
            self.counters.failed_calls += 1
        elif untrainable is not None:
            self.counters.untrainable_calls += 1
        if assignment.seq > 0 and tokens.prompt_token_ids is not None and not stitched:
            self.counters.stitch_misses += 1
        sequences = [
            tokens.prompt_token_ids + ids
            for ids in tokens.completion_token_ids or []
            if tokens.prompt_token_ids is not None
        ]
        try:
            await self._save(batch)
        except StoreError as exc:
            self.counters.lost_records += 1
            log.error(
                "LOST RECORD of call %d of trajectory %s (%d lost so far): %s",
                assignment.seq,
                assignment.trajectory_id,
                self.counters.lost_records,
                exc,
            )
            self._tracker.record_call(
                assignment, keys, sequences, committed=False, prompt_key=prompt_key, replies=replies
            )
            if self._policy is OnStoreError.fail:
                raise StoreUnavailable(
                    "the call could not be recorded (the proxy's log has the reason)"
                ) from exc
            return
        self._tracker.record_call(
            assignment, keys, sequences, committed=True, prompt_key=prompt_key, replies=replies
        )

    async def _save(self, batch: Batch) -> None:
        """Journal `batch` (or commit it, with no journal), its secrets scrubbed; `StoreError` if
        it cannot be kept. (Only the fields clients and upstreams write are searched: a search of
        the whole frame, token ids included, took 85 us against 31 for those fields.)"""
        batch = _scrubbed(batch)
        if self._journal is None:
            await self._store.write(batch)
            return
        try:
            payload = encode(batch)
        except TypeError as exc:  # a value orjson cannot write: no store could take it either
            raise StoreError(f"the record cannot be written as JSON: {exc}") from exc
        try:
            position = self._journal.append(payload)
        except JournalError as exc:  # a full disk: the store itself is the last resort
            self._journal_refused(exc)
            # Behind the records journaled before it, never ahead: its trajectory may be among
            # them, and the store would refuse it or the trajectory's calls land out of order.
            waiting = self._journaled_before_stored
            if waiting is not None and not await waiting():
                raise StoreError(
                    f"{exc}, and the records journaled before it are not in the store yet"
                ) from exc
            await self._store.write(batch)
            return
        try:
            await self._journal.synced(position)
        except JournalError as exc:
            # Journaled but not known to be on disk: answered once the ingester has committed it
            # (a second copy written directly would meet it there), else as the policy says.
            self._journal_refused(exc)
            waiting = self._journaled_before_stored
            if waiting is None or not await waiting():
                raise

    def _journal_refused(self, exc: JournalError) -> None:
        """Say so, at most every `_REPORT_EVERY_S` (a full disk refuses every call)."""
        self._journal_refusals += 1
        now = time.monotonic()
        if now - self._journal_refusal_logged >= _REPORT_EVERY_S:
            log.error(
                "%s; committing to the store instead (%d records since the last report)",
                exc,
                self._journal_refusals,
            )
            self._journal_refusal_logged, self._journal_refusals = now, 0

    def _observe(self, call: CallInProgress, outcome: Outcome, seconds: float) -> None:
        """`/metrics`' figures of an answered call (call_metrics.py)."""
        assert call.model is not None  # the caller checked
        requested = call.body.get("model")
        alias = requested if isinstance(requested, str) and requested != call.model else ""
        usage = outcome.response.get("usage") if outcome.response else None
        first = None if call.first_chunk_at is None else call.first_chunk_at - call.started
        self.counters.by_model.observe(
            self._label(call.model),
            self._label(alias) if alias else "",
            usage if isinstance(usage, dict) else None,
            seconds,
            first,
        )

    @staticmethod
    def _continuation(
        call: CallInProgress, outcome: Outcome
    ) -> tuple[list[JsonObject], str | None, list[str]]:
        """The call's replies, the key of its messages, and the key of its messages plus each
        reply: what the next call of its conversation is recognised by."""
        if call.kind != "chat" or outcome.response is None or outcome.status != "ok":
            return [], None, []
        replies = reply_messages(outcome.response)
        conversation = call.assignment.conversation  # hashed once, when the call was attributed
        if conversation is not None:
            return replies, conversation.prompt_key, conversation.reply_keys(replies)
        prompt_key, keys = call_keys(list(call.body.get("messages") or []), replies)
        return replies, prompt_key, keys


def _scrubbed(batch: Batch) -> Batch:
    """`batch` with every secret redacted from what clients and upstreams wrote (privacy/redaction.py)."""
    rows: list[tuple[RowKind, Row]] = []
    for kind, row in batch.rows:
        if kind is RowKind.call:
            call = cast(CallRow, row)
            error = call["error"]
            row = {
                **call,
                "request": scrub(call["request"]),
                "response": _scrub_response(call["response"]),
                "client_request": scrub(call["client_request"]),
                "error": scrub_text(error) if error is not None else None,
            }
        elif kind is RowKind.scenario:
            scenario = cast(ScenarioRow, row)
            row = {**scenario, "opening": scrub(scenario["opening"])}
        elif kind is RowKind.trajectory:
            trajectory = cast(TrajectoryRow, row)
            row = {**trajectory, "metadata": scrub(trajectory["metadata"])}
        rows.append((kind, row))
    return Batch(rows)


def _scrub_response(response: JsonObject | None) -> JsonObject | None:
    """`scrub` for an answer, its choices' logprob entries left out of the search: each is one
    token (its text, bytes and alternatives), too short to hold a credential, and the answer's
    token ids, which the record keeps for training, say the same. They were most of what was
    searched in an answer with logprobs (a 256-token stream: about 1 ms)."""
    if response is None:
        return None
    choices = response.get("choices")
    if not isinstance(choices, list) or not any(
        isinstance(choice, dict) and choice.get("logprobs") for choice in choices
    ):
        return scrub(response)
    without = [
        {key: value for key, value in choice.items() if key != "logprobs"}
        if isinstance(choice, dict)
        else choice
        for choice in choices
    ]
    scrubbed = scrub({**response, "choices": without})
    if scrubbed["choices"] is without:  # nothing to redact
        return response
    return {
        **scrubbed,
        "choices": [
            {**clean, "logprobs": choice.get("logprobs")} if isinstance(clean, dict) else clean
            for clean, choice in zip(scrubbed["choices"], choices, strict=True)
        ],
    }


def _text(value: str) -> str:
    """A text column's value: PostgreSQL refuses the NUL character, so it is stored as U+FFFD."""
    return value.replace("\x00", "\ufffd")


def _guidance(call: CallInProgress, prompt_ids: list[int] | None) -> Guidance | None:
    """Where the call's guidance sits in the prompt ids the model saw; None when that cannot be
    told (no ids either way, or the tokenizer merged it with its neighbours)."""
    if call.guidance is None or call.unguided_prompt_ids is None or prompt_ids is None:
        return None
    return located(call.guidance, call.unguided_prompt_ids, prompt_ids)


def _stitched(prompt_ids: list[int] | None, previous: list[list[int]]) -> bool:
    if prompt_ids is None:
        return False
    return any(prompt_ids[: len(sequence)] == sequence for sequence in previous)


def _creation_rows(
    assignment: Assignment, now: datetime, keys: list[str], prompt_key: str | None
) -> list[tuple[RowKind, Row]]:
    """The rows that create the trajectory; a first call is folded into them (one statement less)."""
    if assignment.new_rows is None:
        return []
    if assignment.seq > 0:  # a lost first record: its trajectory is created with a later call
        return assignment.new_rows.pairs()
    trajectory: TrajectoryRow = {
        **assignment.new_rows.trajectory,
        "call_count": 1,
        "updated_at": now,
        "tip_key": keys[0] if keys else None,
        "tip_prompt_key": prompt_key if keys else None,
    }
    return replace(assignment.new_rows, trajectory=trajectory).pairs()
