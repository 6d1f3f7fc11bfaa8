from __future__ import annotations

import pytest
import torch

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
