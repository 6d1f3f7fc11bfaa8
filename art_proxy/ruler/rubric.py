"""The rubric the judge scores by: RULER's default, the user's own text, or a checklist.

A rubric file ending in .json, .yaml or .yml is a checklist (Rubrics as Rewards): weighted
criteria, `{"criteria": [{"id", "description", "weight"}]}`, each marked per trajectory, the score
being the weighted mean of the marks (`checklist.py`). Any other file is plain text, shown to the
judge as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from art_proxy.ruler.errors import RubricError

DEFAULT_RUBRIC = """\
- A trajectory that achieves its goal scores much higher than one that does not.
- Among trajectories that achieve the goal, the more efficient one scores higher: fewer steps, \
fewer wasted or failed tool calls, a more direct answer.
- A trajectory that makes partial progress towards the goal scores higher than one that makes \
none, in proportion to the progress made.
- Scores only need to be consistent within this group: use the range to separate better from \
worse, and give equal scores only to trajectories that are equally good."""


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)

    id: str = Field(min_length=1, description="Short name the judge answers with.")
    description: str = Field(min_length=1, description="What a trajectory must do to meet it.")
    weight: float = Field(1.0, gt=0, description="Its share of the score (relative to the rest).")


class Checklist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    criteria: list[Criterion] = Field(min_length=1)

    @field_validator("criteria")
    @classmethod
    def _ids_are_unique(cls, criteria: list[Criterion]) -> list[Criterion]:
        seen: set[str] = set()
        for criterion in criteria:
            if criterion.id in seen:
                raise ValueError(f"criterion id {criterion.id!r} appears more than once")
            seen.add(criterion.id)
        return criteria

    @property
    def total_weight(self) -> float:
        return sum(criterion.weight for criterion in self.criteria)


Rubric = str | Checklist

_CHECKLIST_SUFFIXES = frozenset({".json", ".yaml", ".yml"})


def load_rubric(path: str | Path | None) -> Rubric:
    """The rubric in the file at `path` (None: the default rubric); `RubricError` in one line."""
    if path is None:
        return DEFAULT_RUBRIC
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RubricError(f"rubric file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RubricError(f"rubric file {path} cannot be read: {exc}") from exc
    if not text.strip():
        raise RubricError(f"rubric file {path} is empty")
    suffix = Path(path).suffix.lower()
    if suffix not in _CHECKLIST_SUFFIXES:
        return text.strip()
    return _checklist(_decoded(text, suffix, path), path)


def rubric_hash(rubric: Rubric) -> str:
    """Judgments are looked up by it: a changed rubric means a new judgment."""
    text = rubric if isinstance(rubric, str) else rubric.model_dump_json()
    return hashlib.sha256(text.encode()).hexdigest()


def _decoded(text: str, suffix: str, path: str | Path) -> Any:
    try:
        return json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if suffix == ".json" else "YAML"
        raise RubricError(f"rubric file {path} is not valid {kind}: {_one_line(exc)}") from exc


def _checklist(value: Any, path: str | Path) -> Checklist:
    try:
        return Checklist.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        prefix = f"{where}: " if where else ""
        raise RubricError(
            f'rubric file {path}: {prefix}{first["msg"]} (expected {{"criteria": [{{"id", '
            '"description", "weight"}, ...]})'
        ) from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
