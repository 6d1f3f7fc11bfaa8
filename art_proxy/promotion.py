"""Safe promotion and automatic rollback of a production alias: the decision rules, without I/O.

A production alias (what production agents call) moves only on evidence. Promotion: a validated
adapter replaces the alias's target when its validation reward is at least the target's (equal
promotes: the newer adapter has seen more data). Rollback: once the promoted target has served
enough scored production trajectories, a live mean below the previous target's (over that target's
own serving period) by more than a margin moves the alias back. Each decision carries its evidence
as a one-line note, which the trainer records with the move or the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from art_proxy.records import LiveReward


@dataclass(frozen=True)
class Decision:
    act: bool = False  # promote, or roll back
    note: str = ""


def decide_promotion(
    candidate_val: float, current: str, current_val: float | None, *, rolled_back: bool = False
) -> Decision:
    """Promote a candidate validated at `candidate_val` over `current` (validated at
    `current_val`, None: never validated, so there is no evidence against the candidate)?"""
    if rolled_back:
        return Decision(note="rolled back earlier in this run")
    if math.isnan(candidate_val):
        return Decision(note="no validation reward")
    if current_val is None:
        return Decision(True, f"val {candidate_val:.2f}; {current} was never validated")
    if candidate_val >= current_val:
        return Decision(True, f"val {candidate_val:.2f} >= {current_val:.2f} ({current})")
    return Decision(note=f"val {candidate_val:.2f} < {current_val:.2f} ({current})")


def decide_rollback(
    current: LiveReward, previous: LiveReward | None, min_trajectories: int, margin: float
) -> Decision:
    """Roll back from `current` to `previous` (None: there is nothing to go back to)?"""
    if previous is None:
        return Decision(note="no previous target")
    if current.count < min_trajectories or current.mean is None:
        return Decision(
            note=f"{current.count} of {min_trajectories} scored prod trajectories on {current.model}"
        )
    if previous.mean is None:
        return Decision(note=f"no scored prod trajectories on {previous.model}")
    note = (
        f"live {current.mean:.2f} (n={current.count}, {current.model}) vs "
        f"{previous.mean:.2f} (n={previous.count}, {previous.model}), margin {margin:.2f}"
    )
    return Decision(current.mean < previous.mean - margin, note)
