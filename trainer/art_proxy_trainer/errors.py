"""The trainer's one error hierarchy."""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error the trainer raises on purpose."""


class EmptyBatchError(TrainerError):
    """No recorded call of the given trajectories carried trainable token ids."""


class SwapError(TrainerError):
    """An upstream or the proxy could not be reached or answered unexpectedly."""


class BaseModelMismatch(TrainerError):
    """The upstream serves another base model than the one the trainer loaded."""


class CheckpointError(TrainerError):
    """A checkpoint could not be read back (wrong run, wrong shapes, damaged files)."""


class SleepError(TrainerError):
    """An upstream could not be put to sleep or woken (vLLM's sleep mode)."""


class DemonstrationError(TrainerError):
    """A demonstration cannot be trained on (no assistant turn, a template that renders its
    earlier turns differently once later ones follow, messages the template refuses)."""


class RolloutsFailed(TrainerError):
    """Every rollout of a step failed with one and the same error (a wrong model name, an agent
    that cannot reach its tool): going on would abandon every step for no signal."""
