"""Model aliases: agents call a stable name, the upstream serves the adapter it points at.

The trainer loads a new adapter (`<alias>@<step>`) into every upstream, then moves the alias with
`PUT /art/v1/aliases/{alias}`. The table lives in the store; each proxy keeps a copy in memory, so
resolving a request's `model` on the hot path is one dict lookup. A move is written to the store
first and then to this proxy's copy at once; the 1-second housekeeping reloads the copy, which is
how every proxy over one PostgreSQL store follows a move within a second.

An alias outlives what it points at: the upstream restarts without the adapter, or another run
unloads it. Such an alias falls back to the base model, with a warning, until the adapter is served
again or the alias moves (`check_served`, fed by upstream_models.py): a call to it is answered by
the base model rather than failing with "model does not exist".

`ALIAS@0` names the base model under an alias (step 0: no adapter), which an alias named after
the base model otherwise hides: what `art-proxy eval --model base` compares the adapters with.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from art_proxy.records import AliasMove, AliasRecord, AliasRequest
from art_proxy.store.trajectory_store import TrajectoryStore

log = logging.getLogger(__name__)


# `ALIAS@0`: the base model under an alias (the trainer's adapters are ALIAS@STEP-TAG, STEP >= 1).
BASE_STEP = "0"


# What `Aliases.label` calls a model name no upstream lists and no alias names.
OTHER_MODEL = "other"


@dataclass(frozen=True)
class ServedModels:
    """What one upstream answered to `GET /v1/models` (upstream_models.py)."""

    names: frozenset[str]  # every model id, adapters included
    bases: tuple[str, ...]  # the entries without a parent: the base model(s)


@dataclass(frozen=True)
class Canary:
    """A candidate serving a share of an alias's new trajectories (records.AliasRecord)."""

    model: str
    fraction: float
    since: datetime  # salts the draw: a new canary draws its trajectories afresh

    def serves(self, trajectory_id: str) -> bool:
        """Whether the canary serves this trajectory: a uniform draw in [0, 1) from a hash of
        the canary's start and the trajectory's id, below the share."""
        digest = hashlib.sha256(f"{self.since.isoformat()}|{trajectory_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.fraction


@dataclass(frozen=True)
class Fallback:
    target: str  # what the alias points at, which some upstream does not serve
    served: str  # what its calls go to meanwhile


class Aliases:
    def __init__(self, store: TrajectoryStore) -> None:
        self._store = store
        self._targets: dict[str, str] = {}  # alias -> the model name the upstream serves
        self._canaries: dict[str, Canary] = {}  # alias -> its canary, where it has one
        self._records: list[AliasRecord] = []
        self._moves = 0  # moves made here: a reload that started before one is stale
        self._fallbacks: dict[str, Fallback] = {}
        self._everywhere: frozenset[str] | None = None  # what every upstream served, last asked
        self._moved_to: dict[str, datetime] = {}  # model -> when an alias moved to it, since
        self._asked_at: datetime | None = None
        self._answers: Sequence[ServedModels] = ()  # every upstream's models, last asked

    def resolve(self, model: str, trajectory_id: str | None = None) -> str:
        """The name to send upstream for a request's `model` (itself when it is no alias;
        `ALIAS@0`: the base model under the alias). An alias with a canary sends a share of its
        trajectories to the candidate: which ones is drawn from the trajectory's id, so every
        proxy, and this one after a restart, draws the same arm for it."""
        target = self._targets.get(model)
        if target is not None:
            canary = self._canaries.get(model)
            if (
                canary is not None
                and trajectory_id is not None
                and canary.serves(trajectory_id)
                and self.is_served(canary.model)  # an unloaded candidate: the target serves
            ):
                return canary.model
            return target
        alias, at, step = model.rpartition("@")
        if at and step == BASE_STEP and alias in self._targets:
            # Until the upstreams have answered, the alias's own name: the trainer names its
            # alias after the base model it serves.
            return (base_model_of(alias, self._answers) if self._answers else None) or alias
        return model

    def is_alias(self, model: str) -> bool:
        return model in self._targets

    def label(self, model: str) -> str:
        """`model` as `/metrics` and the spans name it: itself when this proxy knows the name (an
        alias, a model an alias moved to, one every upstream listed when last asked), else
        `OTHER_MODEL`. A name a client made up is its own text (a key, an address), and an
        upstream that answers any name would grow a series for each."""
        known = (
            model in self._targets
            or model in self._targets.values()
            or model in self._moved_to
            or (self._everywhere is not None and model in self._everywhere)
        )
        return model if known else OTHER_MODEL

    def is_served(self, model: str) -> bool:
        """Whether every upstream serves `model`: it did when last asked (yes, before any
        answer), or an alias moved to it since (the trainer loads an adapter everywhere first)."""
        return self._everywhere is None or model in self._everywhere or model in self._moved_to

    @property
    def records(self) -> list[AliasRecord]:
        return self._records

    @property
    def fallbacks(self) -> dict[str, Fallback]:
        """The aliases whose target is not served, and what serves their calls instead."""
        return {
            alias: fallback
            for alias, fallback in self._fallbacks.items()
            if self._targets.get(alias) == fallback.served
        }

    def check_served(self, served: Sequence[ServedModels], asked_at: datetime) -> None:
        """Fall back to the base model for each alias whose target some upstream does not serve
        (`served`: every upstream's answer, asked at `asked_at`); end the fallback of one that is
        served again. An alias moved since `asked_at` waits for the next check: its adapter may
        have been loaded after the upstream answered."""
        if not served:
            return
        self._everywhere = served[0].names.intersection(*(models.names for models in served[1:]))
        self._answers = served
        self._moved_to = {m: at for m, at in self._moved_to.items() if at > asked_at}
        self._asked_at = asked_at
        for record in self._records:
            if record.updated_at > asked_at:
                continue
            fallback = self._fallbacks.get(record.alias)
            if all(record.model in models.names for models in served):
                if fallback is not None:
                    del self._fallbacks[record.alias]
                    log.info("alias %r serves %s again", record.alias, record.model)
            elif fallback is None or fallback.target != record.model:
                base = base_model_of(record.alias, served)
                if base is None:
                    log.error(
                        "alias %r points at %s, which an upstream does not serve, and the "
                        "upstreams share no base model to fall back to: its calls fail until "
                        "the adapter is loaded again or the alias moves (art-proxy alias set)",
                        record.alias,
                        record.model,
                    )
                    continue
                self._fallbacks[record.alias] = Fallback(record.model, base)
                log.warning(
                    "alias %r points at %s, which an upstream does not serve (it restarted, or "
                    "another run unloaded it): its calls go to the base model %s until the "
                    "adapter is loaded again (POST /v1/load_lora_adapter with lora_name %s) or "
                    "the alias moves (art-proxy alias reset %s)",
                    record.alias,
                    record.model,
                    base,
                    record.model,
                    record.alias,
                )
        self._set(self._records)

    async def reload(self) -> None:
        """Replace the copy with the store's table (at start-up, then every second)."""
        moves_before = self._moves
        records = await self._store.aliases()
        if self._moves == moves_before:  # else a move landed meanwhile: the next reload has it
            self._set(records)

    async def move(self, alias: str, request: AliasRequest) -> AliasMove:
        """Point `alias` at `request.model` (or start, change or end its canary): in the store,
        then here."""
        move = await self._store.set_alias(alias, request)
        self._moves += 1
        self._set(await self._store.aliases())
        return move

    def _set(self, records: list[AliasRecord]) -> None:
        for record in records:
            if self._asked_at is None or record.updated_at > self._asked_at:
                self._moved_to.setdefault(record.model, record.updated_at)
            # A canary's candidate was loaded everywhere before it began, as a move's adapter.
            since = record.canary_since
            if record.canary and since and (self._asked_at is None or since > self._asked_at):
                self._moved_to.setdefault(record.canary, since)
        self._records = sorted(records, key=lambda record: record.alias)
        self._targets = {record.alias: self._served(record) for record in self._records}
        self._canaries = {
            record.alias: Canary(record.canary, record.canary_fraction, record.canary_since)
            for record in self._records
            if record.canary is not None and record.canary_since is not None
        }

    def _served(self, record: AliasRecord) -> str:
        fallback = self._fallbacks.get(record.alias)
        return fallback.served if fallback and fallback.target == record.model else record.model


def base_model_of(alias: str, served: Sequence[ServedModels]) -> str | None:
    """What an alias whose adapter is gone serves: its own name where every upstream serves a base
    model by it (an alias named after the base), else the one base model they all serve."""
    if all(alias in models.bases for models in served):
        return alias
    shared = set(served[0].bases).intersection(*(models.bases for models in served[1:]))
    return shared.pop() if len(shared) == 1 else None
