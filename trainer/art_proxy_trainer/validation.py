"""The validation record of a run: the best reward and its step, a plateau (`--patience`), and a
warning when the training reward rises while validation falls (reward hacking)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from art_proxy.records import CallRecord, TrainableGroup
from art_proxy.rewards import mean_or_nan
from art_proxy_trainer.checkpoint import TrainerState
from art_proxy_trainer.swap import step_of_run

log = logging.getLogger(__name__)


@dataclass
class Stopping:
    """Plateau and reward-hacking watch over the validation rewards."""

    patience: int
    min_delta: float
    since_best: int = 0
    warnings: list[str] = field(default_factory=list)
    on_warning: Callable[[str], None] = log.warning

    def plateaued(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    def validated(self, state: TrainerState, step: int, val_reward: float) -> bool:
        """Track the validation reward; True when it is the best so far."""
        previous = state.val_history[-1] if state.val_history else None
        state.val_history.append((step, val_reward))
        best = state.best_val is None or val_reward > state.best_val + self.min_delta
        if best:
            state.best_val, state.best_step = val_reward, step
            self.since_best = 0
        else:
            self.since_best += 1
        if previous is not None:
            self._watch_for_reward_hacking(state, previous, step, val_reward)
        return best and step > 0

    def served_weights(
        self, state: TrainerState, served: Mapping[str, float], alias: str
    ) -> int | None:
        """The step whose weights served a validation (`validated_step`; where its calls do
        not say, those trained now)."""
        return validated_step(served, alias, state.run_tag) if served else state.policy_step

    def served_validation(
        self, state: TrainerState, weights: int | None, val_reward: float
    ) -> int | None:
        """Track a validation as that of `weights` (`served_weights`; None: of no one weights of
        this run, tracked as none's): the step whose checkpoint is now the best validated, else
        None."""
        if weights is None or not self.validated(state, weights, val_reward):
            return None
        return weights

    def _watch_for_reward_hacking(
        self, state: TrainerState, previous: tuple[int, float], step: int, val_reward: float
    ) -> None:
        # Reward hacking: the policy gets better at what the judge rewards while getting worse
        # at what validation measures.
        # The training reward around the previous validation (the first steps' after a
        # validation of the base model, which has none before it).
        before = [r for s, r in state.reward_history if s <= previous[0]][-3:]
        train_then = mean_or_nan(before or [r for _, r in state.reward_history][:3])
        train_now = mean_or_nan([r for s, r in state.reward_history if s <= step][-3:])
        delta = self.min_delta
        if train_now > train_then + delta and val_reward < previous[1] - delta:
            warning = (
                f"step {step}: training reward rose {train_then:.2f} -> {train_now:.2f} while "
                f"validation fell {previous[1]:.2f} -> {val_reward:.2f}: possible reward hacking "
                "(look at the trajectories; tighten the rubric or the reward)"
            )
            self.warnings.append(warning)
            self.on_warning(warning)


def validation_by_model(
    groups: Sequence[TrainableGroup], calls: Mapping[str, list[CallRecord]]
) -> dict[str, float]:
    """Served model -> mean validation reward of the trajectories it served (each counts for
    its first call's model, as the store's live rewards do): in the sidecar, validation groups
    may span several adapters."""
    rewards: dict[str, list[float]] = {}
    for group in groups:
        for trajectory, reward in group.rewards.items():
            served = calls.get(trajectory)
            if served and served[0].model is not None:
                rewards.setdefault(served[0].model, []).append(reward)
    return {model: mean_or_nan(values) for model, values in rewards.items()}


def validated_step(validated: Mapping[str, float], alias: str, run_tag: str) -> int | None:
    """The step whose weights served a validation (`validation_by_model`'s models; 0: the base
    model). None where it measured no one weights of this run: an adapter of another run served
    some of it, or a swap came while it ran and several of this run's served it (its mean is of
    a mix, and crediting any one of them would rank a checkpoint on another's rollouts; the
    whole loop names its validation's adapter, so only the sidecar's can be mixed)."""
    steps = {step_of_run(model, alias, run_tag) for model in validated}
    if len(steps) != 1 or None in steps:
        return None
    return steps.pop()
