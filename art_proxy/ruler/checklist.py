"""Checklist rubrics (Rubrics as Rewards): the judge marks each criterion, the weights decide.

The judge never writes a score here: it marks every criterion of the rubric for every trajectory
as met, partially or not (1, 0.5, 0), with a sentence why, and the score is the weighted mean of
the marks. Weights stay out of the prompt, so a criterion is marked on its own merits. Answers
are found and their ids checked as for plain rubrics (`parse.py`); within an entry, every
criterion must be marked exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from art_proxy.records import CriterionMark
from art_proxy.ruler.errors import InvalidAnswer
from art_proxy.ruler.parse import (
    ParsedScore,
    answer_items,
    explanation_of,
    find_json,
    first_of,
    validate,
)
from art_proxy.ruler.rubric import Checklist

MARKS = {"met": 1.0, "partially": 0.5, "not": 0.0}
# Other words judges use for the three marks.
_MARK_WORDS = {
    **MARKS,
    **{"yes": 1.0, "true": 1.0, "fully met": 1.0, "partial": 0.5, "partially met": 0.5},
    **{"no": 0.0, "false": 0.0, "not met": 0.0, "unmet": 0.0},
}
_CRITERIA_KEYS = ("criteria", "marks", "checklist")
_CRITERION_ID_KEYS = ("id", "criterion", "name")
_MARK_KEYS = ("mark", "status", "verdict", "met")


class CriterionItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The criterion's id as listed in the rubric.")
    explanation: str = Field(description="One sentence on why it is marked so.")
    mark: Literal["met", "partially", "not"]


class ChecklistItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The trajectory's id as shown (t1, t2...).")
    criteria: list[CriterionItem]


class ChecklistAnswer(BaseModel):
    """The answer's schema, sent as `response_format` to judges with structured output."""

    model_config = ConfigDict(extra="forbid")

    scores: list[ChecklistItem]


def checklist_text(checklist: Checklist) -> str:
    """The rubric section of the prompt."""
    lines = [f"- {criterion.id}: {criterion.description}" for criterion in checklist.criteria]
    return "Mark each criterion for each trajectory: met, partially or not.\n" + "\n".join(lines)


def checklist_answer_format(labels: Sequence[str], checklist: Checklist) -> str:
    first = checklist.criteria[0].id
    return (
        "Reply with JSON only, in this form:\n"
        '{"scores": [{"id": "t1", "criteria": [{"id": "' + first + '", "explanation": '
        '"<one sentence>", "mark": "met"}, ...]}]}\n'
        f"Give every trajectory id exactly once ({', '.join(labels)}), each with every criterion "
        f"exactly once ({', '.join(c.id for c in checklist.criteria)}), marked "
        '"met", "partially" or "not".'
    )


def parse_checklist_answer(
    text: str, labels: Sequence[str], checklist: Checklist
) -> dict[str, ParsedScore]:
    """Marks and weighted score per label, or `InvalidAnswer` naming every problem."""
    items = answer_items(find_json(text))
    if items is None:
        raise InvalidAnswer(
            'the answer holds no JSON object of the form {"scores": [{"id", "criteria": '
            '[{"id", "explanation", "mark"}, ...]}, ...]}'
        )
    return validate(items, labels, lambda item, label: _read_marks(item, label, checklist))


def checklist_score(marks: Sequence[CriterionMark], checklist: Checklist) -> float:
    weights = {criterion.id: criterion.weight for criterion in checklist.criteria}
    return sum(weights[mark.id] * mark.mark for mark in marks) / checklist.total_weight


def _read_marks(item: dict[str, Any], label: str, checklist: Checklist) -> ParsedScore | str:
    entries = _entries(first_of(item, _CRITERIA_KEYS))
    if entries is None:
        return f"{label} has no criteria list"
    ids = [criterion.id for criterion in checklist.criteria]
    problems: list[str] = []
    marks: dict[str, CriterionMark] = {}
    for entry in entries:
        criterion = str(first_of(entry, _CRITERION_ID_KEYS) or "").strip()
        if criterion not in ids:
            problems.append(f"{label}: criterion {criterion!r} is not one of {', '.join(ids)}")
        elif criterion in marks:
            problems.append(f"{label}: criterion {criterion} is marked more than once")
        else:
            value = first_of(entry, _MARK_KEYS)
            mark = _mark(value)
            if mark is None:
                problems.append(f"{label}: {criterion} is marked {value!r}, not met/partially/not")
            else:
                marks[criterion] = CriterionMark(
                    id=criterion, mark=mark, explanation=explanation_of(entry)
                )
    missing = [criterion for criterion in ids if criterion not in marks]
    if missing and not problems:
        problems.append(f"{label}: criteria not marked: {', '.join(missing)}")
    if problems:
        return "; ".join(problems)
    ordered = tuple(marks[criterion] for criterion in ids)
    return ParsedScore(checklist_score(ordered, checklist), _summary(ordered), ordered)


def _entries(value: Any) -> list[dict[str, Any]] | None:
    """Criteria as a list of objects, from a list or from `{"id": mark or {...}}`."""
    if isinstance(value, dict):
        return [
            {"id": key, **entry} if isinstance(entry, dict) else {"id": key, "mark": entry}
            for key, entry in value.items()
        ]
    if isinstance(value, list) and all(isinstance(entry, dict) for entry in value):
        return value
    return None


def _mark(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value) if value in (0, 0.5, 1) else None
    if isinstance(value, str):
        return _MARK_WORDS.get(" ".join(value.lower().replace("_", " ").split()))
    return None


def _summary(marks: Sequence[CriterionMark]) -> str:
    """The marks in a line, e.g. `met: correct, cites; partially: concise; not: polite`."""
    groups = [
        f"{word}: {', '.join(mark.id for mark in marks if mark.mark == value)}"
        for word, value in MARKS.items()
        if any(mark.mark == value for mark in marks)
    ]
    return "; ".join(groups)
