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
from dataclasses import dataclass, field, replace

from pydantic import BaseModel

from art_proxy.privacy.pii import PiiRedactor, Placeholders
from art_proxy.records import (
    EnsembleMember,
    JudgeMode,
    Judgment,
    JudgmentStatus,
    TrajectoryScore,
)
from art_proxy.ruler.cache import cache_key, reusable, reuse
from art_proxy.ruler.checklist import ChecklistAnswer, parse_checklist_answer
from art_proxy.ruler.client import JudgeClient, JudgeReply, JudgeRequest
from art_proxy.ruler.ensemble import consensus, ensemble_name
from art_proxy.ruler.errors import (
    InvalidAnswer,
    JudgeRejected,
    JudgeUnavailable,
    PromptTooLong,
    RubricError,
)
from art_proxy.ruler.logprob import digit_after_label, parse_logprob_answer, score_of
from art_proxy.ruler.orders import order_agreement, permutations, relabelled
from art_proxy.ruler.parse import JudgeAnswer, ParsedScore, parse_answer
from art_proxy.ruler.prompt import JudgePrompt, Member, TokenCounter, approx_tokens, build_prompt
from art_proxy.ruler.reward import RewardRule
from art_proxy.ruler.rubric import Rubric, rubric_hash
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

# Backoff doubles from `backoff` up to this many seconds between two tries.
_MAX_BACKOFF_S = 60.0
# Room for a json answer in the judge's context: a score and a sentence or two a trajectory.
_ANSWER_TOKENS_PER_LABEL = 120
# A checklist's answer: a mark and a sentence for each criterion of each trajectory.
_CRITERION_TOKENS = 60
# Logprob mode reads a digit a trajectory ("t12: 7\n", about 5 tokens).
_DIGIT_TOKENS_PER_LABEL = 8
# What a re-ask adds besides the invalid answer: the message saying what was wrong.
_REASK_TOKENS = 64
# Rebuilds of a prompt the judge's own tokenizer found longer than the estimate allowed.
_FITS = 3


@dataclass(frozen=True)
class RulerSettings:
    rubric: Rubric
    mode: JudgeMode = "json"
    max_prompt_tokens: int = 32_000  # 0 = no limit
    attempts: int = 3  # answers asked for before judge_failed
    retries: int = 4  # extra tries of an unreachable or rate-limited call
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    samples: int = 1  # answers asked of each judge (several: sample at a temperature above 0)
    orders: int = 1  # orders each group is shown in (orders.py): position debiasing
    reward: RewardRule = field(default_factory=RewardRule)

    def __post_init__(self) -> None:
        if not isinstance(self.rubric, str) and self.mode != "json":
            raise RubricError(
                "a checklist rubric needs --judge-mode json (logprob mode reads one digit per "
                "trajectory)"
            )


class _PrefillRefused(Exception):
    """The judge refused `continue_final_message`: it writes the whole answer instead."""


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

    def merge(self, other: _Tally) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd


@dataclass
class _Outcome:
    status: JudgmentStatus
    reason: str | None = None
    scores: dict[str, ParsedScore] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)  # an ensemble's spread, by label
    rank_agreement: float | None = None
    order_agreement: float | None = None
    members: list[EnsembleMember] = field(default_factory=list)


@dataclass(frozen=True)
class _Verdict:
    """What one member of the ensemble concluded, and what asking it cost."""

    judge_model: str
    sample: int
    outcome: _Outcome
    tally: _Tally
    order: int = 1  # which of the group's orders it was shown (orders.py)


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
        self._count_tokens = count_tokens
        self._not_prefillable: set[str] = set()  # judges that refused continue_final_message

    async def score_group(self, group_id: str, members: Sequence[Member]) -> Judgment:
        """Judge `members` (the finished trajectories of `group_id`) and store the judgment."""
        judgment, new = await self._judge(group_id, members)
        if new:
            await self.store.add_judgment(judgment)
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
            return self._record(group_id, ids, "", _Outcome("skipped", reason), _Tally()), True
        try:
            prompts = await self._fitted_prompts(members)
        except PromptTooLong as exc:
            outcome = _Outcome("judge_failed", str(exc))
            return self._record(group_id, ids, "", outcome, _Tally()), True
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
        outcome, tally = self._combined(verdicts, labels)
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

    async def _fitted_prompts(self, members: Sequence[Member]) -> list[JudgePrompt]:
        """The group's prompt in each order, fitted to `--judge-max-prompt-tokens` and to the
        judges' context where their servers say it: room is left for the answer twice and a
        note, since a re-ask sends the prompt, the invalid answer and what was wrong. The prompt
        is counted by the estimate, then by the judge's own tokenizer where its server counts,
        and built again smaller while the judge's count is over. Raises PromptTooLong."""
        room = self._context_room(len(members))
        budget = self.settings.max_prompt_tokens
        if room is not None:
            budget = min(budget, room) if budget else room
        for _ in range(_FITS):
            prompts = [
                build_prompt(
                    [members[index] for index in order],
                    self.settings.rubric,
                    self.settings.mode,
                    max_tokens=budget,
                    count_tokens=self._count_tokens,
                )
                for order in permutations(len(members), self.settings.orders)
            ]
            if room is None:
                return prompts
            counted = [await self._judge_count(prompt) for prompt in prompts]
            longest = max((c for c in counted if c is not None), default=None)
            if longest is None or longest <= room:
                return prompts
            # The estimate undercounted this judge's tokens: shrink by what it missed.
            budget = max(1, int(budget * room / longest * 0.95))
        raise PromptTooLong(
            f"the group does not fit the judge's context of {self._context()} tokens with room "
            "for its answer, even with long texts trimmed: judge smaller groups, or a judge with "
            "a longer context"
        )

    def _context(self) -> int | None:
        contexts = [judge.context_tokens for judge in self.judges if judge.context_tokens]
        return min(contexts) if contexts else None

    def _context_room(self, labels: int) -> int | None:
        """Prompt tokens the judges' smallest known context leaves (None: none is known)."""
        context = self._context()
        if context is None:
            return None
        return max(1, context - 2 * self._answer_room(labels) - _REASK_TOKENS)

    def _answer_room(self, labels: int) -> int:
        """Tokens an answer over `labels` trajectories may take (a checklist's: a mark and a
        sentence for each criterion of each)."""
        rubric = self.settings.rubric
        if self.settings.mode == "logprob":
            per_label = _DIGIT_TOKENS_PER_LABEL
        elif isinstance(rubric, str):
            per_label = _ANSWER_TOKENS_PER_LABEL
        else:
            per_label = _CRITERION_TOKENS * len(rubric.criteria)
        return per_label * labels + 16

    async def _judge_count(self, prompt: JudgePrompt) -> int | None:
        counts = [await judge.prompt_tokens(prompt.messages) for judge in self.judges]
        known = [count for count in counts if count is not None]
        return max(known) if known else None

    def _answer_tokens(self, labels: int) -> int | None:
        """The cap on an answer where a judge's context is known (the room `_context_room`
        leaves it), else none."""
        return None if self._context() is None else self._answer_room(labels)

    async def _member(
        self, judge: JudgeClient, sample: int, order: int, prompts: Sequence[JudgePrompt]
    ) -> _Verdict:
        """One judge's answer (one sample of it) over the group shown in order `order`, its
        scores under the first order's labels."""
        tally = _Tally()
        shown = prompts[order - 1]
        outcome = await self._ask(judge, shown, tally)
        if order > 1:
            outcome.scores = relabelled(outcome.scores, shown.labels, prompts[0].labels)
        return _Verdict(judge.model, sample, outcome, tally, order)

    async def _ask(self, judge: JudgeClient, prompt: JudgePrompt, tally: _Tally) -> _Outcome:
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
                max_tokens=self._answer_tokens(len(labels)),
            )
            reply = await self._answer(judge, request, tally)
            if isinstance(reply, _Outcome):
                return reply
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

    async def _read_digits(
        self, judge: JudgeClient, prompt: JudgePrompt, tally: _Tally
    ) -> _Outcome:
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
            if isinstance(reply, _Outcome):
                return reply
            if not reply.tokens:
                return _Outcome(
                    "judge_failed", "the answer came without logprobs; logprob mode needs them"
                )
            distribution = digit_after_label(reply.tokens)
            if not distribution:
                written_text = "".join(choice.token for choice in reply.tokens)
                return _Outcome(
                    "judge_failed",
                    f"no digit among the judge's likeliest tokens after {label}: "
                    f"(it wrote {written_text!r})",
                )
            scores[label] = score_of(distribution)
            written = f"{begun} {max(distribution, key=lambda d: distribution[d])}\n"
        return _Outcome("scored", scores=scores)

    async def _answer(
        self, judge: JudgeClient, request: JudgeRequest, tally: _Tally
    ) -> JudgeReply | _Outcome:
        """The judge's reply, or the `judge_failed` outcome its failure is. Raises
        _PrefillRefused when the judge refuses to continue a begun answer."""
        try:
            return await self._call(judge, request, tally)
        except JudgeUnavailable as exc:
            return _Outcome("judge_failed", f"judge unavailable after {tally.calls} tries: {exc}")
        except JudgeRejected as exc:
            refused = exc.status == 400 and "continue_final_message" in str(exc)
            if request.continue_final and refused:
                raise _PrefillRefused from exc
            return _Outcome("judge_failed", f"judge rejected the request: {exc}")

    async def _call(self, judge: JudgeClient, request: JudgeRequest, tally: _Tally) -> JudgeReply:
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

    def _combined(
        self, verdicts: Sequence[_Verdict], labels: Sequence[str]
    ) -> tuple[_Outcome, _Tally]:
        """One outcome from the ensemble's verdicts (one judge's verdict stands as it is)."""
        tally = _Tally()
        for verdict in verdicts:
            tally.merge(verdict.tally)
        if len(verdicts) == 1:
            return verdicts[0].outcome, tally
        members = [_member_record(verdict, labels) for verdict in verdicts]
        named = [(self._member_name(verdict), verdict) for verdict in verdicts]
        scored = [(name, v.outcome.scores) for name, v in named if v.outcome.status == "scored"]
        if not scored:
            reasons = "; ".join(f"[{name}] {verdict.outcome.reason}" for name, verdict in named)
            reason = f"every member of the ensemble failed: {reasons}"
            return _Outcome("judge_failed", reason, members=members), tally
        if len(scored) == 1:
            return _Outcome("scored", scores=dict(scored[0][1]), members=members), tally
        agreed = consensus(scored, labels)
        outcome = _Outcome(
            "scored",
            scores=agreed.scores,
            std=agreed.std,
            rank_agreement=agreed.rank_agreement,
            members=members,
        )
        return outcome, tally

    def _member_name(self, verdict: _Verdict) -> str:
        name = verdict.judge_model
        if self.settings.samples > 1:
            name += f" #{verdict.sample}"
        if self.settings.orders > 1:
            name += f" (order {verdict.order})"
        return name

    def _record(
        self,
        group_id: str,
        ids: list[str],
        key: str,
        outcome: _Outcome,
        tally: _Tally,
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


def _member_record(verdict: _Verdict, labels: Sequence[str]) -> EnsembleMember:
    scores = verdict.outcome.scores
    return EnsembleMember(
        judge_model=verdict.judge_model,
        sample=verdict.sample,
        order=verdict.order,
        status="scored" if verdict.outcome.status == "scored" else "judge_failed",
        reason=verdict.outcome.reason,
        scores={label: scores[label].score for label in labels if label in scores},
        attempts=verdict.tally.calls,
        prompt_tokens=verdict.tally.prompt_tokens,
        completion_tokens=verdict.tally.completion_tokens,
        cost_usd=verdict.tally.cost_usd,
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
