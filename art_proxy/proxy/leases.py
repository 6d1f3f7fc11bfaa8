"""Leases: a trajectory keeps the adapter its first call got, while the alias moves on.

An agent calls a stable alias, and the trainer moves it to each new adapter. A trajectory whose
calls straddle a move would be an episode of two policies: its reward would credit both, and the
trainer would score its later calls as sampled by the newer one. So the first call of a
trajectory through an alias takes a lease on the model the alias serves then, and its later calls
through that alias go to the same model, however often the alias moves meanwhile (ART's adapter
leases). A new trajectory gets the alias's current target.

A lease holds while its model is served: an upstream that restarted without the adapter (or an
operator who unloaded it) breaks it, and the trajectory moves to what the alias serves now; the
call records the model that served it, as every call does, and the break is counted
(`/health` `leases.broken`). The trainer keeps the adapters open trajectories hold loaded
(`GET /art/v1/leases`, from the store, so it sees every proxy's), and unloads them once those
trajectories finish; the proxy answers with its memory too, where a lease whose first call is
still running, or still in the journal, lives before the store has it. Leases live in the proxy's
memory with the trajectory: a trajectory another proxy (or this one before a restart) started
keeps, at its next call here, the model that served its last call (`served_before`, read from
the store), while that model is served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from .open_trajectories import OpenTrajectory

# Whether every upstream serves a model (aliases.py `Aliases.is_served`).
Served = Callable[[str], bool]


@dataclass
class LeaseCounters:
    broken: int = 0  # leases whose model was no longer served: the trajectory moved on


def leased_model(
    trajectory: OpenTrajectory | None,
    alias: str,
    target: str,
    served: Served,
    counters: LeaseCounters,
) -> str:
    """What serves a call of `trajectory` to `alias`, whose current target is `target`: the
    lease's model while it is served, else `target` (and the lease is taken or moved)."""
    if trajectory is None:  # an unrecorded call: nothing to keep it on
        return target
    held = trajectory.leases.get(alias, trajectory.served_before)
    if held is not None:
        if held == target or served(held):
            trajectory.leases[alias] = held
            return held
        counters.broken += 1
    trajectory.leases[alias] = target
    return target


def held(trajectories: list[OpenTrajectory]) -> dict[str, int]:
    """Open trajectories by the model each lease holds (this proxy's memory)."""
    return dict(Counter(model for t in trajectories for model in t.leases.values()))
