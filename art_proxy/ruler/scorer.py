"""Scoring one group: cache, one call per judge, validation, retries; the outcome is a Judgment.

A group of one is `skipped` (nothing to compare it with). Otherwise the prompt is built once,
looked up in the cache, and sent to every judge (one judge is an ensemble of one; `samples` asks
each judge that many times). An invalid answer is sent back to the judge with what was wrong, up
to `attempts` answers; an unreachable or rate-limited judge is retried `retries` times with
exponential backoff. When that runs out, or the judge rejects the request, that judge has failed.
The group is recorded `judge_failed` with the reason when every judge failed or the group does
not fit the prompt budget: a failure is data, and the trainer skips and counts such groups. The
judges that scored are averaged (`ensemble.py`), then the reward rule sets each trajectory's
reward (`reward.py`). Every call's tokens and cost are added to the judgment.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace

from pydantic import BaseModel

from art_proxy.privacy.pii import PiiRedactor, Placeholders
from art_proxy.records import (
    Judgment,
    TrajectoryScore,
)
from art_proxy.ruler.cache import cache_key, reusable, reuse
from art_proxy.ruler.checklist import ChecklistAnswer, parse_checklist_answer
from art_proxy.ruler.client import JudgeClient, JudgeReply, JudgeRequest
from art_proxy.ruler.ensemble import Outcome, Tally, Verdict, combined, ensemble_name
from art_proxy.ruler.errors import (
    InvalidAnswer,
    JudgeRejected,
    JudgeUnavailable,
    PromptTooLong,
)
from art_proxy.ruler.fitting import PromptFitter
from art_proxy.ruler.logprob import digit_after_label, parse_logprob_answer, score_of
from art_proxy.ruler.orders import order_agreement, relabelled
from art_proxy.ruler.parse import JudgeAnswer, ParsedScore, parse_answer
from art_proxy.ruler.prompt import JudgePrompt, Member, TokenCounter, approx_tokens
from art_proxy.ruler.rubric import rubric_hash
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

# Backoff doubles from `backoff` up to this many seconds between two tries.
_MAX_BACKOFF_S = 60.0


class _PrefillRefused(Exception):
    """The judge refused `continue_final_message`: it writes the whole answer instead."""


def _redacted(members: Sequence[Member], placeholders: Placeholders) -> list[Member]:
    """The members' conversations and users' comments as the judge may see them (privacy/pii.py)."""
    return [
        replace(
            member,
            messages=placeholders.value(list(member.messages)),
            feedback=[
                feedback.model_copy(update={"comment": placeholders.value(feedback.comment)})
                for feedback in member.feedback
            ],
        )
        for member in members
    ]


class Ruler:
    """Scores groups with one judge or an ensemble and one rubric; stores each judgment."""

    def __init__(
        self,
        judges: JudgeClient | Sequence[JudgeClient],
        store: TrajectoryStore,
        settings: RulerSettings,
        *,
        count_tokens: TokenCounter = approx_tokens,
        redactor: PiiRedactor | None = None,
    ) -> None:
        self._redactor = redactor  # personal data replaced before the judge sees a group
        self.judges = list(judges) if isinstance(judges, Sequence) else [judges]
        if not self.judges:
            raise ValueError("a Ruler needs at least one judge")
        self.store = store
        self.settings = settings
        self.judge_model = ensemble_name([judge.model for judge in self.judges], settings.samples)
        # What the cache keys answers by: an answer over one order is not one over several.
        self._cached_as = (
            self.judge_model
            if settings.orders == 1
            else f"{self.judge_model} in {settings.orders} orders"
        )
        self.rubric_hash = rubric_hash(settings.rubric)
        self._fitter = PromptFitter(self.judges, settings, count_tokens)
        self._not_prefillable: set[str] = set()  # judges that refused continue_final_message

    async def score_group(self, group_id: str, members: Sequence[Member]) -> Judgment:
        """Judge `members` (the finished trajectories of `group_id`) and store the judgment."""
        judgment, new = await self._judge(group_id, members)
        if new and not await self.store.add_judgment(judgment):
            # Nothing of what the judge said of it is kept; a later `judge` run judges the
            # group's other members without it.
            return judgment.model_copy(
                update={
                    "status": "skipped",
                    "reason": "a member was erased while the group was judged",
                    "scores": [],
                }
            )
        return judgment

    async def judgment(self, group_id: str, members: Sequence[Member]) -> Judgment:
        """Judge `members` afresh, storing nothing and reading no cache: for a group judged as
        it is served (best-of-N), whose record goes with its members' (proxy/best_of.py)."""
        judgment, _ = await self._judge(group_id, members, cached=False)
        return judgment

    async def _judge(
        self, group_id: str, members: Sequence[Member], *, cached: bool = True
    ) -> tuple[Judgment, bool]:
        """The judgment, and whether it is new (a cache hit on the same group is not)."""
        ids = [member.trajectory_id for member in members]
        if self._redactor is not None:  # one scope a group: the same value, the same placeholder
            members = await asyncio.to_thread(_redacted, members, self._redactor.placeholders())
        if len(members) < 2:
            count = f"{len(members)} finished trajectory" + ("" if len(members) == 1 else "s")
            reason = f"the group has {count}; RULER compares two or more"
            return self._record(group_id, ids, "", Outcome("skipped", reason), Tally()), True
        try:
            prompts = await self._fitter.prompts(members)
        except PromptTooLong as exc:
            outcome = Outcome("judge_failed", str(exc))
            return self._record(group_id, ids, "", outcome, Tally()), True
        prompt = prompts[0]
        key = cache_key(self._cached_as, self.settings.mode, prompt)
        programmatic = {member.trajectory_id: member.reward for member in members}
        earlier = await self.store.cached_judgment(key) if cached else None
        if earlier is not None and reusable(earlier):
            judgment = reuse(earlier, group_id, prompt.labels, self.settings.reward, programmatic)
            if earlier.group_id == group_id and _same_result(earlier, judgment):
                return earlier, False
            return judgment, True
        verdicts = await asyncio.gather(
            *(
                self._member(judge, sample, order, prompts)
                for order in range(1, len(prompts) + 1)
                for judge in self.judges
                for sample in range(1, self.settings.samples + 1)
            )
        )
        labels = list(prompt.labels)
        outcome, tally = combined(
            verdicts, labels, samples=self.settings.samples, orders=self.settings.orders
        )
        if len(prompts) > 1 and outcome.status == "scored":
            by_order = [
                [
                    v.outcome.scores
                    for v in verdicts
                    if v.order == o and v.outcome.status == "scored"
                ]
                for o in range(1, len(prompts) + 1)
            ]
            outcome.order_agreement = order_agreement(by_order, labels)
        return self._record(group_id, ids, key, outcome, tally, prompt, programmatic), True

    async def _member(
        self, judge: JudgeClient, sample: int, order: int, prompts: Sequence[JudgePrompt]
    ) -> Verdict:
        """One judge's answer (one sample of it) over the group shown in order `order`, its
        scores under the first order's labels."""
        tally = Tally()
        shown = prompts[order - 1]
        outcome = await self._ask(judge, shown, tally)
        if order > 1:
            outcome.scores = relabelled(outcome.scores, shown.labels, prompts[0].labels)
        return Verdict(judge.model, sample, outcome, tally, order)

    async def _ask(self, judge: JudgeClient, prompt: JudgePrompt, tally: Tally) -> Outcome:
        if self.settings.mode == "logprob" and judge.model not in self._not_prefillable:
            try:
                return await self._read_digits(judge, prompt, tally)
            except _PrefillRefused:
                self._not_prefillable.add(judge.model)
        labels = list(prompt.labels)
        messages = prompt.messages
        problem = ""
        for _ in range(self.settings.attempts):
            request = JudgeRequest(
                messages,
                self.settings.mode,
                len(labels),
                self._answer_schema(),
                max_tokens=self._fitter.answer_tokens(len(labels)),
            )
            reply = await self._answer(judge, request, tally)
            if isinstance(reply, Outcome):
                return reply
            if reply.cut_while_thinking:  # the same room would cut a re-ask again
                return Outcome("judge_failed", _still_thinking(request.max_tokens))
            try:
                return Outcome("scored", scores=self._parse(reply, labels))
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
        return Outcome("judge_failed", f"no valid answer in {attempts} attempts: {problem}")

    async def _read_digits(self, judge: JudgeClient, prompt: JudgePrompt, tally: Tally) -> Outcome:
        """Logprob mode, one call per trajectory: the answer is begun up to `tK:` (the earlier
        lines with their likeliest digits) and the digit's distribution is read where the judge
        goes on. Raises _PrefillRefused when the judge cannot continue a begun answer."""
        scores: dict[str, ParsedScore] = {}
        written = ""
        for label in prompt.labels:
            begun = f"{written}{label}:"
            request = JudgeRequest(
                [*prompt.messages, {"role": "assistant", "content": begun}],
                "logprob",
                1,
                continue_final=True,
            )
            reply = await self._answer(judge, request, tally)
            if isinstance(reply, Outcome):
                return reply
            if not reply.tokens:
                return Outcome(
                    "judge_failed", "the answer came without logprobs; logprob mode needs them"
                )
            distribution = digit_after_label(reply.tokens)
            if not distribution:
                written_text = "".join(choice.token for choice in reply.tokens)
                return Outcome(
                    "judge_failed",
                    f"no digit among the judge's likeliest tokens after {label}: "
                    f"(it wrote {written_text!r})",
                )
            scores[label] = score_of(distribution)
            written = f"{begun} {max(distribution, key=lambda d: distribution[d])}\n"
        return Outcome("scored", scores=scores)

    async def _answer(
        self, judge: JudgeClient, request: JudgeRequest, tally: Tally
    ) -> JudgeReply | Outcome:
        """The judge's reply, or the `judge_failed` outcome its failure is. Raises
        _PrefillRefused when the judge refuses to continue a begun answer."""
        try:
            return await self._call(judge, request, tally)
        except JudgeUnavailable as exc:
            return Outcome("judge_failed", f"judge unavailable after {tally.calls} tries: {exc}")
        except JudgeRejected as exc:
            refused = exc.status == 400 and "continue_final_message" in str(exc)
            if request.continue_final and refused:
                raise _PrefillRefused from exc
            return Outcome("judge_failed", f"judge rejected the request: {exc}")

    async def _call(self, judge: JudgeClient, request: JudgeRequest, tally: Tally) -> JudgeReply:
        delay = self.settings.backoff
        for retry in range(self.settings.retries + 1):
            tally.calls += 1
            try:
                reply = await judge.complete(request)
            except JudgeUnavailable:
                if retry == self.settings.retries:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                continue
            tally.add(reply)
            return reply
        raise AssertionError("unreachable: the last retry raises or returns")

    def _answer_schema(self) -> type[BaseModel] | None:
        if self.settings.mode == "logprob":
            return None
        return JudgeAnswer if isinstance(self.settings.rubric, str) else ChecklistAnswer

    def _parse(self, reply: JudgeReply, labels: Sequence[str]) -> dict[str, ParsedScore]:
        rubric = self.settings.rubric
        if self.settings.mode == "logprob":
            if not reply.tokens:
                raise InvalidAnswer("the answer came without logprobs; logprob mode needs them")
            return parse_logprob_answer(reply.tokens, labels)
        if isinstance(rubric, str):
            return parse_answer(reply.text, labels)
        return parse_checklist_answer(reply.text, labels, rubric)

    def _record(
        self,
        group_id: str,
        ids: list[str],
        key: str,
        outcome: Outcome,
        tally: Tally,
        prompt: JudgePrompt | None = None,
        programmatic: Mapping[str, float | None] | None = None,
    ) -> Judgment:
        labels = prompt.labels if prompt is not None else {}
        scores = [
            TrajectoryScore(
                trajectory_id=labels[label],
                label=label,
                score=parsed.score,
                explanation=parsed.explanation,
                std=outcome.std.get(label),
                criteria=list(parsed.criteria),
                reward=parsed.score,
            )
            for label, parsed in sorted(outcome.scores.items(), key=_label_order)
        ]
        return Judgment(
            id=uuid.uuid4().hex,
            group_id=group_id,
            judge_model=self.judge_model,
            mode=self.settings.mode,
            rubric_hash=self.rubric_hash,
            cache_key=key,
            status=outcome.status,
            reason=outcome.reason,
            trajectory_ids=ids,
            scores=self.settings.reward.apply(scores, programmatic or {}),
            attempts=tally.calls,
            prompt_tokens=tally.prompt_tokens,
            completion_tokens=tally.completion_tokens,
            cost_usd=tally.cost_usd,
            members=outcome.members,
            rank_agreement=outcome.rank_agreement,
            order_agreement=outcome.order_agreement,
            reward_rule=self.settings.reward.name,
            created_at=utcnow(),
        )


def _same_result(cached: Judgment, judgment: Judgment) -> bool:
    """Whether re-judging the same group from the cache would record nothing new."""
    return (
        judgment.trajectory_ids == cached.trajectory_ids
        and judgment.scores == cached.scores
        and judgment.reward_rule == cached.reward_rule
    )


def _label_order(item: tuple[str, ParsedScore]) -> int:
    return int(item[0].removeprefix("t"))


def _still_thinking(room: int | None) -> str:
    if room is None:  # no cap was sent: the judge's own limit (its context) cut it
        return "the judge was still thinking when its context ran out"
    return (
        f"the judge was still thinking when its answer's room of {room} tokens ran out: give "
        "a reasoning judge room to think with --judge-thinking-tokens"
    )
