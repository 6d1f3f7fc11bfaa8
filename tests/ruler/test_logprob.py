"""Logprob scoring: the expected digit over the judge's digit probabilities, read per trajectory."""

from __future__ import annotations

import math

import pytest

from art_proxy.records import JsonObject
from art_proxy.ruler.client import JudgeReply, JudgeRequest
from art_proxy.ruler.errors import InvalidAnswer, JudgeRejected
from art_proxy.ruler.logprob import (
    TokenChoice,
    digit_distribution,
    expected_score,
    parse_logprob_answer,
)
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import logprob_tokens


def choices(distributions: dict[str, dict[int, float]]) -> list[TokenChoice]:
    return [
        TokenChoice(
            token["token"],
            token["logprob"],
            [(top["token"], top["logprob"]) for top in token["top_logprobs"]],
        )
        for token in logprob_tokens(distributions)
    ]


def test_the_score_is_the_expected_digit_over_nine() -> None:
    top = [("7", math.log(0.5)), (" 9", math.log(0.3)), ("0", math.log(0.2)), ("x", math.log(0.4))]
    distribution = digit_distribution(top)
    # "x" is no digit and " 9" counts as 9; the rest renormalises to 0.5 + 0.3 + 0.2 = 1.
    assert distribution == pytest.approx({0: 0.2, 7: 0.5, 9: 0.3})
    assert expected_score(distribution) == pytest.approx((0.5 * 7 + 0.3 * 9) / 9)


def test_digits_renormalise_when_other_tokens_take_mass() -> None:
    top = [("3", math.log(0.2)), ("6", math.log(0.2)), ("hello", math.log(0.6))]
    assert expected_score(digit_distribution(top)) == pytest.approx(4.5 / 9)


def test_only_ascii_digits_count() -> None:
    top = [("2", math.log(0.5)), ("²", math.log(0.3)), ("٣", math.log(0.2))]
    assert digit_distribution(top) == {2: 1.0}


def test_the_same_token_with_and_without_a_space_adds_up() -> None:
    top = [("9", math.log(0.25)), (" 9", math.log(0.25)), ("0", math.log(0.5))]
    assert digit_distribution(top) == pytest.approx({0: 0.5, 9: 0.5})


def test_each_label_is_scored_at_its_own_digit() -> None:
    distributions = {"t1": {9: 0.8, 8: 0.2}, "t2": {1: 0.6, 2: 0.4}, "t3": {5: 1.0}}
    scores = parse_logprob_answer(choices(distributions), ["t1", "t2", "t3"])
    assert scores["t1"].score == pytest.approx((9 * 0.8 + 8 * 0.2) / 9)
    assert scores["t2"].score == pytest.approx((1 * 0.6 + 2 * 0.4) / 9)
    assert scores["t3"].score == pytest.approx(5 / 9)
    assert "expected digit 8.80" in scores["t1"].explanation


def test_labels_are_found_in_any_order_and_t1_is_not_t10() -> None:
    labels = [f"t{i}" for i in range(1, 11)]
    distributions = {label: {i % 10: 1.0} for i, label in enumerate(labels[::-1])}
    scores = parse_logprob_answer(choices(distributions), labels)
    assert scores["t10"].score == 0.0 and scores["t1"].score == pytest.approx(1.0)


def test_a_missing_label_is_an_invalid_answer() -> None:
    with pytest.raises(InvalidAnswer, match="no digit score for t2"):
        parse_logprob_answer(choices({"t1": {3: 1.0}}), ["t1", "t2"])


class _HostedJudge:
    """A judge that returns logprobs but cannot continue a begun answer (a hosted API)."""

    model = "hosted/judge"
    context_tokens: int | None = None  # a hosted API does not say

    def __init__(self, answer: list[TokenChoice]) -> None:
        self.answer = answer
        self.requests: list[JudgeRequest] = []

    async def prompt_tokens(self, messages: list[JsonObject]) -> int | None:
        return None

    async def complete(self, request: JudgeRequest) -> JudgeReply:
        self.requests.append(request)
        if request.continue_final:
            raise JudgeRejected(
                "HTTP 400: Unrecognized request argument supplied: continue_final_message",
                status=400,
            )
        return JudgeReply("", self.answer, 10, 10, 0.0)

    async def aclose(self) -> None:
        pass


async def test_a_judge_that_cannot_be_prefilled_writes_the_whole_answer(
    store: TrajectoryStore,
) -> None:
    group, _ = await record_group(store, [answered("Paris."), answered("Turtles.")])
    judge = _HostedJudge(choices({"t1": {9: 1.0}, "t2": {2: 1.0}}))
    ruler = Ruler(judge, store, RulerSettings(rubric=DEFAULT_RUBRIC, mode="logprob"))
    judgment = await ruler.score_group(group, await finished_members(store, group))
    assert judgment.status == "scored", judgment.reason
    assert [s.score for s in judgment.scores] == pytest.approx([1.0, 2 / 9])
    # Refused once, then asked for the whole answer (and not prefilled again).
    assert [r.continue_final for r in judge.requests] == [True, False]
