"""The trainer's one error hierarchy."""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error the trainer raises on purpose."""


class EmptyBatchError(TrainerError):
    """No recorded call of the given trajectories carried trainable token ids."""
