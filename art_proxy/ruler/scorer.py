"""Scoring one group: cache, one judge call, validation, retries; the outcome is always a Judgment.

A group of one is `skipped` (nothing to compare it with). Otherwise the prompt is built, looked up
in the cache, and sent. An invalid answer is sent back to the judge with what was wrong, up to
`attempts` answers; an unreachable or rate-limited judge is retried `retries` times with
exponential backoff. When that runs out, or the judge rejects the request, or the group does not fit
the prompt budget, the group is recorded `judge_failed` with the reason: a failure is data, and
the trainer skips and counts such groups. Every call's tokens and cost are added to the judgment.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from art_proxy.records import JudgeMode, Judgment, JudgmentStatus, TrajectoryScore
from art_proxy.ruler.cache import cache_key, reuse
from art_proxy.ruler.client import JudgeClient, JudgeReply, JudgeRequest
from art_proxy.ruler.errors import InvalidAnswer, JudgeRejected, JudgeUnavailable, PromptTooLong
from art_proxy.ruler.logprob import parse_logprob_answer
from art_proxy.ruler.parse import ParsedScore, parse_answer
from art_proxy.ruler.prompt import JudgePrompt, Member, TokenCounter, approx_tokens, build_prompt
from art_proxy.ruler.rubric import rubric_hash
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

# Backoff doubles from `backoff` up to this many seconds between two tries.
_MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class RulerSettings:
    rubric: str
    mode: JudgeMode = "json"
    max_prompt_tokens: int = 32_000  # 0 = no limit
    attempts: int = 3  # answers asked for before judge_failed
    retries: int = 4  # extra tries of an unreachable or rate-limited call
    backoff: float = 1.0  # seconds before the first retry; doubles each time


@dataclass
class _Tally:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, reply: JudgeReply) -> None:
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.cost_usd += reply.cost_usd


@dataclass
class _Outcome:
    status: JudgmentStatus
    reason: str | None = None
    scores: dict[str, ParsedScore] = field(default_factory=dict)


class Ruler:
    """Scores groups with one judge and one rubric and records each judgment in the store."""

    def __init__(
        self,
        client: JudgeClient,
        store: TrajectoryStore,
        settings: RulerSettings,
        *,
        count_tokens: TokenCounter = approx_tokens,
    ) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.rubric_hash = rubric_hash(settings.rubric)
        self._count_tokens = count_tokens

    async def score_group(self, group_id: str, members: Sequence[Member]) -> Judgment:
        """Judge `members` (the finished trajectories of `group_id`) and store the judgment."""
        judgment, new = await self._judge(group_id, members)
        if new:
            await self.store.add_judgment(judgment)
        return judgment

    async def _judge(self, group_id: str, members: Sequence[Member]) -> tuple[Judgment, bool]:
        """The judgment, and whether it is new (a cache hit on the same group is not)."""
        ids = [member.trajectory_id for member in members]
        if len(members) < 2:
            count = f"{len(members)} finished trajectory" + ("" if len(members) == 1 else "s")
            reason = f"the group has {count}; RULER compares two or more"
            return self._record(group_id, ids, "", _Outcome("skipped", reason), _Tally()), True
        try:
            prompt = build_prompt(
                members,
                self.settings.rubric,
                self.settings.mode,
                max_tokens=self.settings.max_prompt_tokens,
                count_tokens=self._count_tokens,
            )
        except PromptTooLong as exc:
            outcome = _Outcome("judge_failed", str(exc))
            return self._record(group_id, ids, "", outcome, _Tally()), True
        key = cache_key(self.client.model, self.settings.mode, prompt)
        cached = await self.store.cached_judgment(key)
        if cached is not None:
            if cached.group_id == group_id and cached.trajectory_ids == ids:
                return cached, False
            return reuse(cached, group_id, prompt.labels), True
        tally = _Tally()
        outcome = await self._ask(prompt, tally)
        return self._record(group_id, ids, key, outcome, tally, prompt), True

    async def _ask(self, prompt: JudgePrompt, tally: _Tally) -> _Outcome:
        labels = list(prompt.labels)
        messages = prompt.messages
        problem = ""
        for _ in range(self.settings.attempts):
            try:
                reply = await self._call(
                    JudgeRequest(messages, self.settings.mode, len(labels)), tally
                )
            except JudgeUnavailable as exc:
                return _Outcome(
                    "judge_failed", f"judge unavailable after {tally.calls} tries: {exc}"
                )
            except JudgeRejected as exc:
                return _Outcome("judge_failed", f"judge rejected the request: {exc}")
            try:
                return _Outcome("scored", scores=self._parse(reply, labels))
            except InvalidAnswer as exc:
                problem = str(exc)
            # Only the latest answer goes back: the prompt stays the size of one attempt.
            messages = [
                *prompt.messages,
                {"role": "assistant", "content": reply.text},
                {
                    "role": "user",
                    "content": f"That answer is not valid: {problem}. Answer again, in the form "
                    "asked for, with every id exactly once.",
                },
            ]
        attempts = self.settings.attempts
        return _Outcome("judge_failed", f"no valid answer in {attempts} attempts: {problem}")

    async def _call(self, request: JudgeRequest, tally: _Tally) -> JudgeReply:
        delay = self.settings.backoff
        for retry in range(self.settings.retries + 1):
            tally.calls += 1
            try:
                reply = await self.client.complete(request)
            except JudgeUnavailable:
                if retry == self.settings.retries:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                continue
            tally.add(reply)
            return reply
        raise AssertionError("unreachable: the last retry raises or returns")

    def _parse(self, reply: JudgeReply, labels: Sequence[str]) -> dict[str, ParsedScore]:
        if self.settings.mode == "json":
            return parse_answer(reply.text, labels)
        if not reply.tokens:
            raise InvalidAnswer("the answer came without logprobs; logprob mode needs them")
        return parse_logprob_answer(reply.tokens, labels)

    def _record(
        self,
        group_id: str,
        ids: list[str],
        key: str,
        outcome: _Outcome,
        tally: _Tally,
        prompt: JudgePrompt | None = None,
    ) -> Judgment:
        labels = prompt.labels if prompt is not None else {}
        return Judgment(
            id=uuid.uuid4().hex,
            group_id=group_id,
            judge_model=self.client.model,
            mode=self.settings.mode,
            rubric_hash=self.rubric_hash,
            cache_key=key,
            status=outcome.status,
            reason=outcome.reason,
            trajectory_ids=ids,
            scores=[
                TrajectoryScore(
                    trajectory_id=labels[label],
                    label=label,
                    score=parsed.score,
                    explanation=parsed.explanation,
                )
                for label, parsed in sorted(outcome.scores.items(), key=_label_order)
            ],
            attempts=tally.calls,
            prompt_tokens=tally.prompt_tokens,
            completion_tokens=tally.completion_tokens,
            cost_usd=tally.cost_usd,
            created_at=utcnow(),
        )


def _label_order(item: tuple[str, ParsedScore]) -> int:
    return int(item[0].removeprefix("t"))
