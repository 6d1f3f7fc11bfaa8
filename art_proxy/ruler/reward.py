"""Hybrid rewards: the RULER score combined with the reward the agent reported at finish.

The trainer reads one number per trajectory, `TrajectoryScore.reward`; this decides it. By default
it is the RULER score. With a mix `(a, b)` it is `a * programmatic + b * score`, and a trajectory
that reported no reward counts as reporting 0: members of one group must share a scale, or a silent
run with score 0.3 (0.3 as its bare score) would outrank a reported failure of the same score
(0.15), and an agent that ends without reporting has not shown success. With the
programmatic reward kept for validation, the reward is the score and the programmatic reward is
recorded beside it, never mixed in. The rule's name is stored with the judgment, so a group is
judged again (from the cache, at no cost) when the rule changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from art_proxy.records import TrajectoryScore


@dataclass(frozen=True)
class RewardRule:
    mix: tuple[float, float] | None = None  # (a, b): a * programmatic + b * RULER score
    programmatic_for_validation: bool = False  # recorded beside the score, not mixed

    def __post_init__(self) -> None:
        if self.mix is not None and self.programmatic_for_validation:
            raise ValueError("a programmatic reward is either mixed in or kept for validation")

    @property
    def name(self) -> str:
        if self.mix is not None:
            a, b = self.mix
            return f"{a:g}*programmatic+{b:g}*ruler"
        if self.programmatic_for_validation:
            return "ruler, programmatic for validation"
        return "ruler"

    def apply(
        self, scores: Sequence[TrajectoryScore], programmatic: Mapping[str, float | None]
    ) -> list[TrajectoryScore]:
        """`scores` with their reward set, `programmatic` being trajectory id -> reported reward."""
        return [self._rewarded(score, programmatic.get(score.trajectory_id)) for score in scores]

    def _rewarded(self, score: TrajectoryScore, programmatic: float | None) -> TrajectoryScore:
        if self.mix is None:
            kept = programmatic if self.programmatic_for_validation else None
            return score.model_copy(
                update={"programmatic": kept, "reward": score.score, "reward_source": "ruler"}
            )
        a, b = self.mix
        reported = 0.0 if programmatic is None else programmatic
        return score.model_copy(
            update={
                "programmatic": programmatic,
                "reward": a * reported + b * score.score,
                "reward_source": "mix",
            }
        )
