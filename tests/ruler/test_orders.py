"""Position debiasing: a group shown in several orders, each trajectory's score its mean.

A scripted judge that scores by position alone (the label's number, as the bundled judge did on
the README's recipe) gives every trajectory the same mean over the given and the reversed order:
no reward for a place. A judge that reads the conversations scores alike in both orders."""

from __future__ import annotations

from statistics import fmean

from art_proxy.records import Judgment
from art_proxy.ruler.ensemble import kendall_tau_b
from art_proxy.ruler.orders import permutations
from art_proxy.ruler.run import finished_members
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import MakeRuler
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import (
    Body,
    Reply,
    answer_by_content,
    json_answer,
    running_scripted_judge,
    trajectories_in,
)

ANSWERS = ["Paris", "Lyon", "Nice", "Lille"]


def by_position(body: Body) -> Reply:
    """t1: 0.2, t2: 0.4, ...: the later shown, the better, whatever was written."""
    labels = list(trajectories_in(body))
    return json_answer([(label, 0.2 * int(label[1:])) for label in labels])


def paris_is_best(text: str) -> float:
    return 0.9 if "Paris" in text else 0.2


async def judged(
    store: TrajectoryStore, make_ruler: MakeRuler, script: object, **settings: object
) -> tuple[Judgment, list[str], int]:
    group, ids = await record_group(store, [answered(text) for text in ANSWERS])
    async with running_scripted_judge(script) as judge:  # type: ignore[arg-type]
        ruler = make_ruler(judge, **settings)
        judgment = await ruler.score_group(group, await finished_members(store, group))
        calls = len(judge.requests)
    return judgment, ids, calls


def correlation_with_position(judgment: Judgment, ids: list[str]) -> float:
    by_id = {score.trajectory_id: score.score for score in judgment.scores}
    return kendall_tau_b([float(i) for i in range(len(ids))], [by_id[t] for t in ids])


async def test_one_order_rewards_a_position_two_orders_do_not(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    once, ids, one_call = await judged(store, make_ruler, by_position)
    twice, ids2, two_calls = await judged(store, make_ruler, by_position, orders=2)

    assert correlation_with_position(once, ids) == 1.0  # what the README's recipe trained on
    assert correlation_with_position(twice, ids2) == 0.0
    assert {round(score.score, 9) for score in twice.scores} == {0.5}  # mean of 0.2k, 0.2(5-k)
    assert twice.order_agreement == -1.0  # the orders disagree: it scored places
    assert (one_call, two_calls) == (1, 2)
    assert once.order_agreement is None
    # Each order is a member of the judgment, its scores under the first order's labels.
    assert [(m.order, m.scores["t1"]) for m in twice.members] == [(1, 0.2), (2, 0.8)]


async def test_a_judge_that_reads_the_conversations_scores_alike_in_every_order(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    judgment, ids, calls = await judged(
        store, make_ruler, answer_by_content(paris_is_best), orders=3
    )
    by_id = {score.trajectory_id: score.score for score in judgment.scores}
    assert [round(by_id[t], 9) for t in ids] == [0.9, 0.2, 0.2, 0.2]
    assert judgment.order_agreement == 1.0 and calls == 3
    # The first order's explanations are kept; another order's name other trajectories by t1...
    assert judgment.scores[0].explanation.endswith("t1 judged")
    assert "order 2" not in judgment.scores[0].explanation


def test_the_orders_are_the_given_the_reversed_then_rotations_never_twice() -> None:
    assert permutations(4, 4) == [[0, 1, 2, 3], [3, 2, 1, 0], [1, 2, 3, 0], [2, 3, 0, 1]]
    assert permutations(2, 8) == [[0, 1], [1, 0]]
    assert permutations(3, 1) == [[0, 1, 2]]
    # Every position is held by each member equally often over n rotations.
    orders = permutations(4, 2)
    assert fmean(order.index(0) for order in orders) == 1.5
