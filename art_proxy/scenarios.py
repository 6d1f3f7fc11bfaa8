"""Scenarios: the tasks an agent is run on, read from a JSONL file, one object a line.

```json
{"id": "trip-1", "input": "Plan a day in Lyon.", "split": "train", "reference": null, "metadata": {}}
```

Only `input` is required. A scenario without an `id` gets a hash of its input in canonical JSON, so
running the same file again files the new rollouts under the same scenario ids in the store. The
file is checked whole before anything runs: a bad line is a `ScenarioFileError` reading
`FILE:LINE: reason`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from art_proxy.errors import ScenarioFileError
from art_proxy.records import JsonObject, ScenarioSplit

# The proxy takes scenario ids of at most this many printable characters (proxy/attribution.py);
# ASCII only, since the id also travels in the X-Art-Scenario header.
MAX_ID_LENGTH = 200


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Unique in its file, printable ASCII; default: a hash of `input`.")
    input: Any = Field(description="What the agent is asked: any JSON value but null.")
    split: ScenarioSplit = Field("train", description="train: learned from; val: measured only.")
    reference: Any | None = Field(
        None, description="A reference answer, for programmatic rewards and validation."
    )
    metadata: JsonObject = Field(default_factory=dict)
    hint: str | None = Field(
        None,
        description="Guidance for a guided retry (train --guided-retries): added to the prompt "
        "when every rollout of the scenario's group failed, never trained on.",
    )

    @field_validator("id")
    @classmethod
    def _id_fits_a_url(cls, value: str) -> str:
        if not 1 <= len(value) <= MAX_ID_LENGTH or not (value.isascii() and value.isprintable()):
            raise ValueError(f"must be 1 to {MAX_ID_LENGTH} printable ASCII characters")
        return value

    @field_validator("input")
    @classmethod
    def _input_is_given(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("must not be null")
        return value


def scenario_id_of(scenario_input: Any) -> str:
    """The id of a scenario given without one: a hash of its input as canonical JSON."""
    canonical = orjson.dumps(scenario_input, option=orjson.OPT_SORT_KEYS)
    return "input-" + hashlib.blake2b(canonical, digest_size=8).hexdigest()


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Every scenario of a JSONL file, in file order; blank lines are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioFileError(f"{path}: cannot read the scenarios file: {exc}") from exc
    scenarios: list[Scenario] = []
    first_line_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        scenario = _parse_line(line, f"{path}:{number}")
        if scenario.id in first_line_of:
            raise ScenarioFileError(
                f"{path}:{number}: duplicate id {scenario.id!r} (first on line "
                f"{first_line_of[scenario.id]}; a scenario without an id is named by its input)"
            )
        first_line_of[scenario.id] = number
        scenarios.append(scenario)
    if not scenarios:
        raise ScenarioFileError(f"{path}: no scenarios (one JSON object a line, with an input)")
    return scenarios


def _parse_line(line: str, where: str) -> Scenario:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ScenarioFileError(f"{where}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ScenarioFileError(f"{where}: not a JSON object")
    if "input" in value and "id" not in value:
        value = {**value, "id": scenario_id_of(value["input"])}
    try:
        return Scenario.model_validate(value)
    except ValidationError as exc:
        raise ScenarioFileError(f"{where}: {_reason(exc.errors()[0])}") from None


def _reason(error: ErrorDetails) -> str:
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"missing {field!r}"
    if error["type"] == "extra_forbidden":
        return f"unknown field {field!r} (put extra data under 'metadata')"
    message = error["msg"].removeprefix("Value error, ")
    return f"{field}: {message}"
