"""The JSON answer parser: tolerant about the wrapping, strict about ids and score ranges."""

from __future__ import annotations

import json

import pytest

from art_proxy.ruler.errors import InvalidAnswer
from art_proxy.ruler.parse import JudgeAnswer, parse_answer

LABELS = ["t1", "t2"]


@pytest.mark.parametrize(
    "text",
    [
        '{"scores": [{"id": "t1", "explanation": "good", "score": 0.9}, '
        '{"id": "t2", "explanation": "bad", "score": 0.1}]}',
        'Here you go:\n```json\n[{"trajectory_id": "t2", "reasoning": "bad", "score": "0.1"}, '
        '{"trajectory_id": "t1", "reasoning": "good", "score": 0.9}]\n```\nDone.',
        'My verdict {"t1": {"score": 0.9, "explanation": "good"}, "t2": {"score": 0.1, '
        '"explanation": "bad"}} as asked.',
    ],
)
def test_answers_are_read_through_prose_fences_and_renamed_keys(text: str) -> None:
    scores = parse_answer(text, LABELS)
    assert scores["t1"].score == 0.9 and scores["t1"].explanation == "good"
    assert scores["t2"].score == 0.1 and scores["t2"].explanation == "bad"


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ([{"id": "t1", "score": 0.5}], "missing: t2"),
        ([{"id": "t1", "score": 0.5}, {"id": "t2", "score": -0.1}], "t2 scores -0.1"),
        ([{"id": "t1", "score": "high"}, {"id": "t2", "score": 0.1}], "t1 has no numeric score"),
        ([{"id": "t1", "score": float("nan")}, {"id": "t2", "score": 0}], "t1 has no numeric"),
        (
            [{"score": 0.5}, {"id": "t1", "score": 0.5}, {"id": "t2", "score": 0}],
            "entry 1 has no id",
        ),
    ],
)
def test_every_problem_is_named(items: list[object], problem: str) -> None:
    with pytest.raises(InvalidAnswer, match=problem):
        parse_answer(json.dumps({"scores": items}), LABELS)


def test_the_schema_sent_as_response_format_requires_every_field() -> None:
    item = JudgeAnswer.model_json_schema()["$defs"]["ScoreItem"]
    assert sorted(item["required"]) == ["explanation", "id", "score"]
