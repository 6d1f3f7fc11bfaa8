"""Ensembles: several judges, or several samples of one, score a group; the mean is the score.

Every member sees the same prompt and is validated and retried on its own (`scorer.py`); a member
that fails is recorded with its reason and the others decide. How much the members disagree is
kept beside the mean: the spread of each trajectory's scores (population std) and the mean Kendall
tau-b between every two members' rankings of the group (1: they rank alike; 0: unrelated, or a
member that ties everything; -1: reversed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from statistics import fmean, pstdev

from art_proxy.records import CriterionMark, EnsembleMember, JudgmentStatus
from art_proxy.ruler.client import JudgeReply
from art_proxy.ruler.parse import ParsedScore


@dataclass(frozen=True)
class Consensus:
    scores: dict[str, ParsedScore]  # label -> mean score, members' explanations, mean marks
    std: dict[str, float]  # label -> population std of the members' scores
    rank_agreement: float


def ensemble_name(models: Sequence[str], samples: int) -> str:
    """How an ensemble is named in judgments: `a+b`, with `*N` when each judge answers N times."""
    name = "+".join(models)
    return f"{name}*{samples}" if samples > 1 else name


def consensus(
    members: Sequence[tuple[str, Mapping[str, ParsedScore]]], labels: Sequence[str]
) -> Consensus:
    """What two or more scored members (each: its name, its scores by label) agree on."""
    scores = {}
    for label in labels:
        answers = [(name, by_label[label]) for name, by_label in members]
        scores[label] = ParsedScore(
            fmean(answer.score for _, answer in answers),
            "\n".join(f"[{name}] {a.explanation}" for name, a in answers if a.explanation),
            _mean_marks(answers),
        )
    std = {label: pstdev(by_label[label].score for _, by_label in members) for label in labels}
    rankings = [[by_label[label].score for label in labels] for _, by_label in members]
    agreement = fmean(kendall_tau_b(x, y) for x, y in combinations(rankings, 2))
    return Consensus(scores, std, agreement)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either ranking allowed); 0 when one side is all ties."""
    concordant = discordant = ties_x = ties_y = 0
    for (x1, y1), (x2, y2) in combinations(zip(x, y, strict=True), 2):
        dx, dy = x1 - x2, y1 - y2
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif (dx > 0) == (dy > 0):
            concordant += 1
        else:
            discordant += 1
    untied_x = concordant + discordant + ties_y  # pairs that x orders
    untied_y = concordant + discordant + ties_x  # pairs that y orders
    if untied_x == 0 or untied_y == 0:
        return 0.0
    return float((concordant - discordant) / (untied_x * untied_y) ** 0.5)


def _mean_marks(answers: Sequence[tuple[str, ParsedScore]]) -> tuple[CriterionMark, ...]:
    """A checklist's marks averaged over the members, their explanations kept side by side."""
    first = answers[0][1].criteria
    if not first:
        return ()
    marks = []
    for index, criterion in enumerate(first):
        each = [(name, answer.criteria[index]) for name, answer in answers]
        marks.append(
            CriterionMark(
                id=criterion.id,
                mark=fmean(mark.mark for _, mark in each),
                explanation="\n".join(f"[{name}] {mark.explanation}" for name, mark in each),
            )
        )
    return tuple(marks)


# What each member concluded, and the one outcome the scorer records (`combined`).


@dataclass
class Tally:
    """The judge calls one verdict took, their tokens and cost."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, reply: JudgeReply) -> None:
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.cost_usd += reply.cost_usd

    def merge(self, other: Tally) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd


@dataclass
class Outcome:
    """What judging a group concluded: its status, and the scores where it scored."""

    status: JudgmentStatus
    reason: str | None = None
    scores: dict[str, ParsedScore] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)  # an ensemble's spread, by label
    rank_agreement: float | None = None
    order_agreement: float | None = None
    members: list[EnsembleMember] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """What one member of the ensemble concluded, and what asking it cost."""

    judge_model: str
    sample: int
    outcome: Outcome
    tally: Tally
    order: int = 1  # which of the group's orders it was shown (orders.py)


def combined(
    verdicts: Sequence[Verdict], labels: Sequence[str], *, samples: int, orders: int
) -> tuple[Outcome, Tally]:
    """One outcome from the ensemble's verdicts (one judge's verdict stands as it is)."""
    tally = Tally()
    for verdict in verdicts:
        tally.merge(verdict.tally)
    if len(verdicts) == 1:
        return verdicts[0].outcome, tally
    members = [_member_record(verdict, labels) for verdict in verdicts]
    named = [(_member_name(verdict, samples, orders), verdict) for verdict in verdicts]
    scored = [(name, v.outcome.scores) for name, v in named if v.outcome.status == "scored"]
    if not scored:
        reasons = "; ".join(f"[{name}] {verdict.outcome.reason}" for name, verdict in named)
        reason = f"every member of the ensemble failed: {reasons}"
        return Outcome("judge_failed", reason, members=members), tally
    if len(scored) == 1:
        return Outcome("scored", scores=dict(scored[0][1]), members=members), tally
    agreed = consensus(scored, labels)
    outcome = Outcome(
        "scored",
        scores=agreed.scores,
        std=agreed.std,
        rank_agreement=agreed.rank_agreement,
        members=members,
    )
    return outcome, tally


def _member_name(verdict: Verdict, samples: int, orders: int) -> str:
    name = verdict.judge_model
    if samples > 1:
        name += f" #{verdict.sample}"
    if orders > 1:
        name += f" (order {verdict.order})"
    return name


def _member_record(verdict: Verdict, labels: Sequence[str]) -> EnsembleMember:
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
