"""The warm start: supervised steps on demonstrations before GRPO (`art-proxy train --sft`).

The demonstrations are rendered once, then taken `sft_batch_size` at a time, each epoch in an
order drawn from the run's seed and the epoch's number: step k of the warm start always holds
the same demonstrations, so a run killed during it resumes with the step after its checkpoint's,
and GRPO follows from the adapter the last warm-start step left. A demonstration is whole in one
step (all of its sequences), so a step's loss is over whole conversations.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from art_proxy.config import TrainSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.batch import TrainingBatch, TrainingSequence, demonstration_batch
from art_proxy_trainer.demonstrations import (
    StoreDemonstrations,
    demonstration_sequences,
    read_demonstrations,
    stored_demonstrations,
)
from art_proxy_trainer.errors import DemonstrationError
from art_proxy_trainer.policy import Policy
from art_proxy_trainer.swap import step_of

# The value of `--sft` that reads the demonstrations from the store.
FROM_STORE = "store"


@dataclass(frozen=True)
class WarmStart:
    demonstrations: Sequence[Sequence[TrainingSequence]]  # each demonstration's sequences
    batch_size: int
    epochs: int
    seed: int
    pad_token_id: int
    skipped: Sequence[str] = ()  # stored trajectories that cannot be rendered, and why

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.demonstrations) / self.batch_size)

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def batch(self, index: int) -> TrainingBatch:
        """The batch of warm-start step `index` (0-based)."""
        epoch, position = divmod(index, self.steps_per_epoch)
        order = list(range(len(self.demonstrations)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        chosen = order[position * self.batch_size : (position + 1) * self.batch_size]
        sequences = [s for n in chosen for s in self.demonstrations[n]]
        return demonstration_batch(sequences, pad_token_id=self.pad_token_id)

    def epoch(self, index: int) -> int:
        return index // self.steps_per_epoch + 1


async def load_warm_start(
    settings: TrainSettings, store: TrajectoryStore, policy: Policy, alias: str
) -> WarmStart:
    """The demonstrations `--sft` names, rendered for `policy`; raises DemonstrationError."""
    assert settings.sft is not None
    if policy.renderer is None:
        raise DemonstrationError("this policy has no chat renderer to render demonstrations with")
    if settings.sft == FROM_STORE:
        names = policy.names | {alias}
        demonstrations = await stored_demonstrations(
            store,
            StoreDemonstrations(
                scenarios=settings.scenario,
                split=settings.sft_split,
                min_reward=settings.sft_min_reward,
                model=settings.sft_model,
            ),
            lambda model: model in names or step_of(model, alias) > 0,
        )
        if not demonstrations:
            raise DemonstrationError(
                "the store has no finished trajectory that --sft-split, --sft-min-reward, "
                "--sft-model and --scenario choose"
            )
    else:
        demonstrations = read_demonstrations(Path(settings.sft))
    rendered: list[list[TrainingSequence]] = []
    skipped: list[str] = []
    for demonstration in demonstrations:
        try:
            rendered.append(
                demonstration_sequences(demonstration, policy.renderer, policy.end_of_turn)
            )
        except DemonstrationError as exc:
            if settings.sft != FROM_STORE:
                raise  # a file's author fixes the line it names
            skipped.append(str(exc))  # a recorded conversation is what it is: left out
    if not rendered:
        raise DemonstrationError(f"no demonstration can be rendered: {skipped[0]}")
    return WarmStart(
        rendered,
        settings.sft_batch_size,
        settings.sft_epochs,
        settings.seed,
        policy.pad_token_id,
        tuple(skipped),
    )
