from __future__ import annotations

from typing import Any

import pytest
import torch

from art_proxy.records import CallRecord
from art_proxy_trainer.batch import TrajectorySample, build_batch, sequences_from_calls
from art_proxy_trainer.errors import EmptyBatchError
from tests.trainer.records import call

TOOL = [20, 21]  # a tool result rendered into the second prompt


def test_stitched_calls_merge_into_one_sequence_masked_on_both_completions() -> None:
    calls = [
        call(1, [1, 2, 3, 10, 11, *TOOL], [12, 13], [-0.3, -0.4]),
        call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]),  # order comes from seq, not from the list
    ]
    sequences, stats = sequences_from_calls("t1", calls)
    assert (stats.sequences, stats.stitch_misses, stats.skipped_calls) == (1, 0, 0)
    [sequence] = sequences
    assert sequence.tokens == [1, 2, 3, 10, 11, 20, 21, 12, 13]
    assert sequence.mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    assert sequence.old_logprobs == [0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4]


def test_a_stitch_miss_starts_a_new_sequence_and_is_counted() -> None:
    # The agent rewrote its history: the second prompt does not extend the first call's ids.
    calls = [call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]), call(1, [1, 2, 9, 10], [12], [-0.3])]
    sequences, stats = sequences_from_calls("t1", calls)
    assert (stats.sequences, stats.stitch_misses) == (2, 1)
    assert [s.tokens for s in sequences] == [[1, 2, 3, 10, 11], [1, 2, 9, 10, 12]]
    assert [s.mask for s in sequences] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]]


def test_a_call_without_token_ids_is_skipped_and_its_reply_becomes_context() -> None:
    calls = [
        call(0, [1, 2], [10], [-0.1]),
        call(1, [], [], [], status="failed"),
        call(2, [1, 2, 10, 30, 31], [12], [-0.3]),
    ]
    [sequence], stats = sequences_from_calls("t1", calls)
    assert (stats.skipped_calls, stats.stitch_misses) == (1, 0)
    assert sequence.mask == [0, 0, 1, 0, 0, 1]


def test_batch_is_right_padded_with_aligned_old_logprobs_and_row_advantages() -> None:
    batch = build_batch(
        [
            TrajectorySample(
                "t1",
                [call(0, [1, 2, 3], [10, 11], [-0.1, -0.2]), call(1, [4], [12], [-0.3])],
                advantage=0.5,
            ),
            TrajectorySample(
                "t2",
                [
                    call(0, [1, 2], [13], [-0.5], trajectory_id="t2"),
                    call(1, [1, 2, 13, *TOOL], [14], [-0.6], trajectory_id="t2"),
                ],
                advantage=-0.5,
            ),
        ],
        pad_token_id=99,
    )
    assert batch.tokens_B_T.tolist() == [
        [1, 2, 3, 10, 11, 99],
        [4, 12, 99, 99, 99, 99],
        [1, 2, 13, 20, 21, 14],
    ]
    assert batch.attention_mask_B_T.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
    ]
    assert batch.mask_B_T.tolist() == [
        [0, 0, 0, 1, 1, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 1],
    ]
    expected_old = torch.tensor(
        [[0, 0, 0, -0.1, -0.2, 0], [0, -0.3, 0, 0, 0, 0], [0, 0, -0.5, 0, 0, -0.6]]
    )
    assert torch.equal(batch.old_logprobs_B_T, expected_old)
    assert batch.advantages_B.tolist() == [0.5, 0.5, -0.5]
    assert (batch.stats.sequences, batch.stats.stitch_misses) == (3, 1)
    assert batch.trained_tokens == 5


def test_a_batch_without_trainable_calls_is_an_error() -> None:
    failed = call(0, [], [], [], status="failed")
    with pytest.raises(EmptyBatchError):
        build_batch([TrajectorySample("t1", [failed], advantage=1.0)])


def test_completion_ids_and_logprobs_must_pair_up() -> None:
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        sequences_from_calls("t1", [call(0, [1], [10, 11], [-0.1])])


def two_choices(first: list[int], second: list[int], messages: list[Any]) -> CallRecord:
    """Call 0 of t1 with n=2: prompt [1, 2, 3], choices `first` and `second`."""
    replies = [{"role": "assistant", "content": text} for text in ("zero", "one")]
    return call(0, [1, 2, 3], first, [-0.1] * len(first)).model_copy(
        update={
            "completion_token_ids": [first, second],
            "logprobs": [[-0.1] * len(first), [-0.9] * len(second)],
            "request": {"messages": messages},
            "response": {"choices": [{"index": i, "message": m} for i, m in enumerate(replies)]},
        }
    )


USER = [{"role": "user", "content": "hi"}]


def test_of_n_choices_the_one_the_agent_continued_is_trained_by_its_ids() -> None:
    calls = [
        two_choices([10, 11], [14, 15], USER),
        call(1, [1, 2, 3, 14, 15, *TOOL], [12], [-0.3]),  # the agent went on from choice 1
    ]
    [sequence], stats = sequences_from_calls("t1", calls)
    assert stats.stitch_misses == 0
    assert sequence.tokens == [1, 2, 3, 14, 15, 20, 21, 12]
    assert sequence.old_logprobs[3:5] == [-0.9, -0.9]  # choice 1's, not choice 0's
    assert 10 not in sequence.tokens


def test_of_n_choices_a_re_rendered_continuation_is_told_by_its_reply() -> None:
    echoed = [*USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "go"}]
    following = call(1, [1, 2, 9, 9], [12], [-0.3]).model_copy(
        update={"request": {"messages": echoed}}
    )
    sequences, stats = sequences_from_calls(
        "t1", [two_choices([10, 11], [14, 15], USER), following]
    )
    assert stats.stitch_misses == 1
    assert [s.tokens for s in sequences] == [[1, 2, 3, 14, 15], [1, 2, 9, 9, 12]]


def test_of_n_choices_one_whose_continuation_cannot_be_told_is_skipped_not_credited() -> None:
    unrelated = call(1, [7, 7], [12], [-0.3]).model_copy(
        update={"request": {"messages": [{"role": "user", "content": "elsewhere"}]}}
    )
    sequences, stats = sequences_from_calls(
        "t1", [two_choices([10, 11], [14, 15], USER), unrelated]
    )
    assert stats.skipped_calls == 1
    assert [s.tokens for s in sequences] == [[7, 7, 12]]
