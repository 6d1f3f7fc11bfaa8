"""Reading the judge's JSON answer: tolerant about its wrapping, strict about its content.

Judges wrap JSON in prose or code fences, rename keys (`trajectory_id`, `reasoning`) or write
scores as strings; all of that is accepted. What is not: an id missing, repeated or unknown, or a
score outside [0, 1]. Those raise `InvalidAnswer` listing every problem at once, which the scorer
shows to the judge when it asks again. Checklist answers (`checklist.py`) are found and checked
for ids the same way; only what each entry holds is read differently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from art_proxy.records import CriterionMark
from art_proxy.ruler.errors import InvalidAnswer

_ID_KEYS = ("id", "trajectory_id", "trajectory", "label")
_SCORE_KEYS = ("score", "reward", "rating")
_EXPLANATION_KEYS = ("explanation", "reason", "reasoning", "rationale", "justification")
_LIST_KEYS = ("scores", "trajectories", "results", "ratings", "judgments")
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class ScoreItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The trajectory's id as shown (t1, t2...).")
    explanation: str = Field(description="One or two sentences on why it scores so.")
    score: float = Field(description="From 0 (worst) to 1 (best).")


class JudgeAnswer(BaseModel):
    """The answer's schema, sent as `response_format` to judges with structured output."""

    model_config = ConfigDict(extra="forbid")

    scores: list[ScoreItem]


@dataclass(frozen=True)
class ParsedScore:
    score: float
    explanation: str
    criteria: tuple[CriterionMark, ...] = ()  # a checklist rubric's marks


# Reads one entry of an answer, already known to be for `label`: its score, or what is wrong.
EntryReader = Callable[[dict[str, Any], str], "ParsedScore | str"]


def parse_answer(text: str, labels: Sequence[str]) -> dict[str, ParsedScore]:
    """One score per label from the judge's reply `text`, or `InvalidAnswer` saying what is wrong."""
    items = answer_items(find_json(text))
    if items is None:
        raise InvalidAnswer(
            'the answer holds no JSON object of the form {"scores": [{"id", "explanation", '
            '"score"}, ...]}'
        )
    return validate(items, labels)


def _read_score(item: dict[str, Any], label: str) -> ParsedScore | str:
    score = _number(first_of(item, _SCORE_KEYS))
    if score is None:
        return f"{label} has no numeric score"
    if not 0.0 <= score <= 1.0:
        return f"{label} scores {score:g}, outside 0 to 1"
    return ParsedScore(score, explanation_of(item))


def explanation_of(item: dict[str, Any]) -> str:
    explanation = first_of(item, _EXPLANATION_KEYS)
    return "" if explanation is None else str(explanation)


def validate(
    items: Sequence[Any], labels: Sequence[str], read: EntryReader = _read_score
) -> dict[str, ParsedScore]:
    """Every label exactly once among `items`, each entry read by `read` (default: a score)."""
    problems: list[str] = []
    scores: dict[str, ParsedScore] = {}
    for position, item in enumerate(items, 1):
        if not isinstance(item, dict):
            problems.append(f"entry {position} is not an object")
            continue
        label = first_of(item, _ID_KEYS)
        if label is None:
            problems.append(f"entry {position} has no id")
            continue
        label = str(label).strip()
        if label not in labels:
            problems.append(f"id {label!r} is not one of {', '.join(labels)}")
            continue
        if label in scores:
            problems.append(f"id {label} appears more than once")
            continue
        parsed = read(item, label)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        scores[label] = parsed
    missing = [label for label in labels if label not in scores and not _mentioned(label, items)]
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if problems:
        raise InvalidAnswer("; ".join(problems))
    return scores


def find_json(text: str) -> Any:
    """The first JSON value in `text` that looks like an answer: fenced, bare or inside prose."""
    candidates = [match.group(1) for match in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        for start, char in enumerate(candidate):
            if char not in "{[":
                continue
            try:
                value, _ = decoder.raw_decode(candidate, start)
            except json.JSONDecodeError:
                continue
            if answer_items(value) is not None:
                return value
    return None


def answer_items(value: Any) -> list[Any] | None:
    """The list of per-trajectory entries in a decoded answer, None if it has no such list."""
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return value
    if not isinstance(value, dict):
        return None
    for key in _LIST_KEYS:
        if isinstance(value.get(key), list):
            return list(value[key])
    # {"t1": 0.8, "t2": {"score": 0.3, "explanation": "..."}}
    if value and all(re.fullmatch(r"t\d+", str(key)) for key in value):
        return [
            {"id": key, **entry} if isinstance(entry, dict) else {"id": key, "score": entry}
            for key, entry in value.items()
        ]
    return None


def first_of(item: dict[str, Any], keys: Sequence[str]) -> Any:
    return next((item[key] for key in keys if key in item), None)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _mentioned(label: str, items: Sequence[Any]) -> bool:
    """Whether an entry names `label` (a problem with it is reported already, not as missing)."""
    return any(
        isinstance(item, dict) and str(first_of(item, _ID_KEYS) or "").strip() == label
        for item in items
    )
