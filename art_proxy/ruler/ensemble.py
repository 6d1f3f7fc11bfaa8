"""Ensembles: several judges, or several samples of one, score a group; the mean is the score.

Every member sees the same prompt and is validated and retried on its own (`scorer.py`); a member
that fails is recorded with its reason and the others decide. How much the members disagree is
kept beside the mean: the spread of each trajectory's scores (population std) and the mean Kendall
tau-b between every two members' rankings of the group (1: they rank alike; 0: unrelated, or a
member that ties everything; -1: reversed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from statistics import fmean, pstdev

from art_proxy.records import CriterionMark
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
