"""Checkpoints: the trainer's whole state after a step, complete or absent, never half written.

`OUT/checkpoints/step-000007/` holds `adapter/` (PEFT format, the directory upstreams load as
`alias@7-<run tag>`), `optimizer.pt` and `state.json` (`TrainerState`, including the step's record with the
groups it consumed). A step that did not move the weights (abandoned: stale groups, no signal, a
NaN) writes `state.json` alone: its weights are those of `policy_step`'s checkpoint, which is kept
while a later checkpoint points at it. A checkpoint is written in a temporary directory and renamed into place, and
only then does `OUT/latest.json` (replaced atomically) point at it. A trainer killed at any moment
thus restarts from the previous step or this one; the step's record travels inside the checkpoint
so a restart writes it to the store if the kill came before the store had it (exactly once: the
store ignores a step it has). `best.json` names the checkpoint with the best validation reward;
checkpoints that are neither the latest, the best, nor an adapter still loaded upstream are deleted.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file

from art_proxy.records import StepKind, TrainingStep
from art_proxy_trainer.errors import CheckpointError
from art_proxy_trainer.policy import Policy, PolicyState, trained_parameters

_ADAPTER_WEIGHTS = "adapter_model.safetensors"


class RunIdentity(BaseModel):
    """What makes a run the user's own: what it trains, on what, from which agent's groups. A
    trainer pointed at a directory whose run differs in any of these resumes it only when told."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model: str
    store: str  # redacted: the checkpoint is a file anyone with the directory reads
    agent: str | None = None
    scenarios: str | None = None

    def differences(self, other: RunIdentity, *, warm_start_only: bool = False) -> list[str]:
        """What differs in `other`. `warm_start_only`: this identity's run has taken warm-start
        steps only, and GRPO may go on with it naming the agent and scenarios it had none of
        (`--sft-only`'s promise); the base model and the store must still be the same."""
        return [
            f"{name} {getattr(self, name)!r} (now {getattr(other, name)!r})"
            for name in type(self).model_fields
            if getattr(self, name) != getattr(other, name)
            and not (warm_start_only and name in _GRPO_NAMES and getattr(self, name) is None)
        ]


# What a warm start's run has none of, and GRPO on it names first.
_GRPO_NAMES = ("agent", "scenarios")


class TrainerState(BaseModel):
    """What a resumed trainer needs besides the weights."""

    model_config = ConfigDict(extra="forbid")

    run: str
    identity: RunIdentity | None = None  # None: a checkpoint from before identities
    # Names this run's adapters (`alias@step-tag`) apart from any other run's on a shared upstream.
    run_tag: str = Field(default_factory=lambda: secrets.token_hex(3))
    step: int = 0
    # The newest step that changed the weights (0: none, the base model): what the policy is now.
    # Abandoned steps count in `step` but not here, so they do not age the groups the same
    # weights go on sampling.
    policy_step: int = 0
    # The steps that changed the weights, oldest first (`policy_step` is the last): a group's
    # staleness is how many of them came after the weights that sampled it (samples.py).
    applied_steps: list[int] = Field(default_factory=list)
    sft_steps: int = 0  # of `step`, those of the warm start (they come first)
    # The kind of the applied steps the optimiser's state comes from (None: none yet): the first
    # GRPO step after a warm start clears it, so GRPO does not go on in the warm start's direction.
    optimizer_kind: StepKind | None = None
    record: TrainingStep | None = None  # the last step's record, for the store
    best_val: float | None = None
    best_step: int | None = None
    val_history: list[tuple[int, float]] = Field(default_factory=list)
    reward_history: list[tuple[int, float]] = Field(default_factory=list)
    loaded_adapters: list[str] = Field(default_factory=list, description="Oldest first.")
    validated: dict[str, float] = Field(
        default_factory=dict, description="Served model -> its latest validation reward."
    )
    rolled_back: list[str] = Field(
        default_factory=list, description="Adapters the production alias was rolled back from."
    )

    @model_validator(mode="before")
    @classmethod
    def _of_an_older_checkpoint(cls, data: Any) -> Any:
        # Checkpoints from before `policy_step` took the last step for the policy's.
        if isinstance(data, dict) and "policy_step" not in data:
            data = {**data, "policy_step": data.get("step", 0)}
        # Checkpoints from before `applied_steps`: every step up to the policy's counts as one
        # that moved the weights (as staleness was counted then: never less stale than it is).
        if isinstance(data, dict) and "applied_steps" not in data:
            data = {**data, "applied_steps": list(range(1, int(data.get("policy_step", 0)) + 1))}
        return data

    @classmethod
    def read(cls, path: Path) -> TrainerState:
        """A checkpoint's state.json; raises OSError or ValueError."""
        data = json.loads(path.read_text())
        # Checkpoints from before tags named their adapters `alias@step`: they keep those names.
        if isinstance(data, dict) and "run_tag" not in data:
            data["run_tag"] = ""
        return cls.model_validate(data)


class Checkpoints:
    def __init__(self, out: Path) -> None:
        self.out = out.resolve()  # adapter paths go to upstreams with another working directory
        self.directory = out / "checkpoints"

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step:06d}"

    def adapter_dir(self, step: int) -> Path:
        return self.path(step) / "adapter"

    def save(self, model: PeftModel, trained: PolicyState | None, state: TrainerState) -> Path:
        """`trained` None: the weights did not change since `state.policy_step`'s checkpoint."""
        final = self.path(state.step)
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        if trained is not None:
            # `trained` is whole even where `model` holds a shard: peft writes it, with the config.
            model.save_pretrained(str(partial / "adapter"), state_dict=trained.adapter)
            torch.save(trained.optimizer, partial / "optimizer.pt")
        (partial / "state.json").write_text(state.model_dump_json(indent=1))
        shutil.rmtree(final, ignore_errors=True)  # a step redone after a kill before latest.json
        os.replace(partial, final)
        self._point("latest", state.step)
        return final

    def mark_best(self, step: int) -> None:
        """Point `best.json` at `step`, where its checkpoint is still kept: a validation served by
        an adapter older than those kept loaded names weights pruned already (the pointer stays)."""
        if self.path(step).is_dir():
            self._point("best", step)

    def latest(self) -> TrainerState | None:
        step = self._pointed("latest")
        if step is None:
            return None
        try:
            return TrainerState.read(self.path(step) / "state.json")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path(step)} is unreadable: {exc}") from exc

    def restore(self, state: TrainerState, policy: Policy) -> None:
        path = self.path(state.policy_step)
        if state.policy_step == 0 and not (path / "adapter").is_dir():
            return  # no step has moved the weights: the fresh adapter is the run's
        try:
            saved = load_file(str(path / "adapter" / _ADAPTER_WEIGHTS))
            # peft's file names the weights without the adapter's name ("default").
            adapter = {
                name: saved[name.replace(f".{policy.model.active_adapter}.", ".", 1)]
                for name, _ in trained_parameters(policy.model)
            }
            optimizer = torch.load(path / "optimizer.pt", weights_only=True)
            policy.load(PolicyState(adapter, optimizer))
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            raise CheckpointError(
                f"cannot resume from {path}: {exc} (another model or LoRA shape? use a new --out)"
            ) from exc

    def prune(self, keep_steps: set[int]) -> None:
        pointed = {s for s in (self._pointed("latest"), self._pointed("best")) if s}
        # A checkpoint without weights resumes from its policy step's.
        keep = keep_steps | pointed | {self._policy_step(step) for step in pointed}
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(".partial") or (
                name.startswith("step-") and int(name[5:]) not in keep
            ):
                shutil.rmtree(path, ignore_errors=True)

    def _policy_step(self, step: int) -> int:
        try:
            state = TrainerState.read(self.path(step) / "state.json")
        except (OSError, ValueError):
            return step
        return state.policy_step

    def _point(self, name: str, step: int) -> None:
        pointer = self.out / f"{name}.json"
        partial = pointer.with_suffix(".json.partial")
        partial.write_text(f'{{"step": {step}}}\n')
        os.replace(partial, pointer)

    def _pointed(self, name: str) -> int | None:
        pointer = self.out / f"{name}.json"
        if not pointer.is_file():
            return None
        try:
            return int(json.loads(pointer.read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{pointer} is unreadable: {exc}") from exc
