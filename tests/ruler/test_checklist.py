"""Checklist rubrics: weighted criteria from a JSON or YAML file, each marked per trajectory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from art_proxy.ruler.checklist import parse_checklist_answer
from art_proxy.ruler.errors import InvalidAnswer, RubricError
from art_proxy.ruler.rubric import Checklist, Criterion, load_rubric
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import MakeRuler
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import checklist_answer, running_scripted_judge

CHECKLIST = Checklist(
    criteria=[
        Criterion(id="correct", description="Names the capital of France.", weight=3),
        Criterion(id="concise", description="Answers in one word."),
    ]
)
YAML = """\
criteria:
  - id: correct
    description: Names the capital of France.
    weight: 3
  - id: concise
    description: Answers in one word.
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [("rubric.yaml", YAML), ("rubric.json", CHECKLIST.model_dump_json(indent=2))],
)
def test_a_checklist_file_in_yaml_or_json_loads_with_its_weights(
    tmp_path: Path, name: str, text: str
) -> None:
    (tmp_path / name).write_text(text)
    rubric = load_rubric(tmp_path / name)
    assert rubric == CHECKLIST
    assert isinstance(rubric, Checklist) and rubric.total_weight == 4


def test_any_other_rubric_file_is_plain_text_even_if_it_looks_like_yaml(tmp_path: Path) -> None:
    (tmp_path / "rubric.txt").write_text("- Correct beats wrong.\n- Short beats long.\n")
    assert load_rubric(tmp_path / "rubric.txt") == "- Correct beats wrong.\n- Short beats long."


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("r.json", '{"criteria": [', "is not valid JSON"),
        ("r.yaml", "criteria: [a: b: c", "is not valid YAML"),
        ("r.json", '{"criteria": []}', "criteria: List should have at least 1 item"),
        (
            "r.yaml",
            "criteria:\n  - id: a\n    weight: 1\n",
            "criteria.0.description: Field required",
        ),
        (
            "r.json",
            '{"criteria": [{"id": "a", "description": "x", "weight": 0}]}',
            "greater than 0",
        ),
        (
            "r.json",
            '{"criteria": [{"id": "a", "description": "x"}, {"id": "a", "description": "y"}]}',
            "'a' appears more than once",
        ),
        ("r.yaml", "- just a list\n", 'expected {"criteria"'),
    ],
)
def test_a_malformed_checklist_file_is_a_one_line_error(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(RubricError) as raised:
        load_rubric(tmp_path / name)
    message = str(raised.value)
    assert problem in message and "\n" not in message
    assert message.startswith(f"rubric file {tmp_path / name}")


def test_a_checklist_needs_json_mode() -> None:
    with pytest.raises(RubricError, match="needs --judge-mode json"):
        RulerSettings(rubric=CHECKLIST, mode="logprob")


async def test_the_judge_marks_each_criterion_and_the_score_is_their_weighted_mean(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(store, [answered("Paris"), answered("Lyon, I think.")])
    marks = {
        "t2": {"concise": "not", "correct": "not"},
        "t1": {"correct": "met", "concise": "partially"},
    }
    async with running_scripted_judge(checklist_answer(marks)) as judge:
        judgment = await make_ruler(judge, rubric=CHECKLIST).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "scored", judgment.reason
    paris, lyon = judgment.scores
    assert (paris.trajectory_id, paris.score, paris.reward) == (ids[0], 0.875, 0.875)
    assert lyon.score == 0.0
    assert [(c.id, c.mark, c.explanation) for c in paris.criteria] == [
        ("correct", 1.0, "t1 correct"),
        ("concise", 0.5, "t1 concise"),
    ]
    assert paris.explanation == "met: correct; partially: concise"
    prompt = judge.prompt()
    assert "- correct: Names the capital of France." in prompt
    assert "weight" not in prompt, "criteria are marked on their own merits"
    schema = json.dumps(judge.requests[0]["response_format"]["json_schema"]["schema"])
    assert '"partially"' in schema and "criteria" in schema
    assert await store.judgments(group=group) == [judgment]


async def test_a_checklist_answer_missing_a_criterion_is_retried_with_the_problem_shown(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    partial = checklist_answer(
        {"t1": {"correct": "met"}, "t2": {"correct": "not", "concise": "met"}}
    )
    whole = checklist_answer(
        {"t1": {"correct": "met", "concise": "met"}, "t2": {"correct": "not", "concise": "met"}}
    )
    async with running_scripted_judge(partial, whole) as judge:
        judgment = await make_ruler(judge, rubric=CHECKLIST).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "scored" and judgment.attempts == 2
    assert "t1: criteria not marked: concise" in judge.requests[1]["messages"][-1]["content"]
    assert [score.score for score in judgment.scores] == [1.0, 0.25]


def test_marks_are_read_in_the_words_and_shapes_judges_use() -> None:
    answer = {
        "t1": {"criteria": {"correct": True, "concise": {"mark": "Partially met", "reason": "ok"}}},
        "t2": {
            "checklist": [
                {"criterion": "correct", "status": "not_met"},
                {"id": "concise", "mark": 1},
            ]
        },
    }
    scores = parse_checklist_answer(json.dumps(answer), ["t1", "t2"], CHECKLIST)
    assert scores["t1"].score == pytest.approx(3.5 / 4)
    assert scores["t1"].criteria[1].explanation == "ok"
    assert scores["t2"].score == pytest.approx(1 / 4)


@pytest.mark.parametrize(
    ("marks", "problem"),
    [
        ({"correct": "met", "concise": "maybe"}, "t1: concise is marked 'maybe'"),
        ({"correct": "met", "concise": 0.7}, "t1: concise is marked 0.7"),
        ({"correct": "met", "concise": "met", "polite": "met"}, "'polite' is not one of"),
    ],
)
def test_a_mark_that_is_not_one_of_the_three_is_named(
    marks: dict[str, object], problem: str
) -> None:
    answer = checklist_answer({"t1": marks, "t2": {"correct": "met", "concise": "met"}})
    with pytest.raises(InvalidAnswer, match=problem):
        parse_checklist_answer(answer.content, ["t1", "t2"], CHECKLIST)
