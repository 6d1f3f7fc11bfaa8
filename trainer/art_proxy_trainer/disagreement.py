"""What a teacher said of one trained choice, kept for people to read: the mean reverse KL over
its tokens and the tokens the teacher would least have written (the trajectory page shows them).
What trains is the per-token term itself (advantages.token_advantages); this is its summary."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from art_proxy.records import CallRecord, TeacherScore, TokenDisagreement
from art_proxy.store.trajectory_store import utcnow

SHOWN = 8  # the most disagreed tokens kept per choice: what a page can show, not a dump


def teacher_score(
    call: CallRecord,
    choice: int,
    teacher_logprobs: Sequence[float],
    *,
    run: str,
    step: int,
    teacher: str,
    decode: Callable[[int], str],
) -> TeacherScore:
    """The summary of `teacher_logprobs` (one per completion id of `call`'s `choice`) against
    the logprobs the sampler drew the same ids with."""
    assert call.completion_token_ids is not None and call.logprobs is not None
    ids, sampled = call.completion_token_ids[choice], call.logprobs[choice]
    gaps = [s - t for s, t in zip(sampled, teacher_logprobs, strict=True)]
    worst = sorted(range(len(gaps)), key=lambda position: -gaps[position])[:SHOWN]
    return TeacherScore(
        call_id=call.id,
        choice=choice,
        trajectory_id=call.trajectory_id,
        run=run,
        step=step,
        teacher=teacher,
        kl=math.fsum(gaps) / len(gaps) if gaps else 0.0,
        tokens=len(gaps),
        disagreements=[
            TokenDisagreement(
                position=position,
                text=decode(ids[position]),
                sampled=sampled[position],
                teacher=teacher_logprobs[position],
            )
            for position in worst
        ],
        created_at=utcnow(),
    )
