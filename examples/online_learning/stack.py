"""The deployment the simulation runs against, one process per service as in production.

`art-proxy local-llm` serves the model; `art-proxy serve` records every call as `prod` (the users'
clients name no split) and shadow-samples the opening calls; `art-proxy train` is the sidecar: it
trains the candidate alias on the groups the store holds and moves the production alias only on
evidence (safe promotion, automatic rollback). The processes are started and stopped by
`art_proxy.up`'s helpers, so they behave as under `art-proxy up`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from art_proxy.config import UpSettings
from art_proxy.up.parts import Part, flags
from art_proxy.up.plan import plan

PROD_ALIAS = "assistant"  # what the production agent calls
CANDIDATE_ALIAS = "assistant-candidate"  # what the trainer moves every step
RUN = "online-learning"
# A candidate is promoted only once its validation groups reach a later step (they ride along with
# the next groups that carry a signal), a few steps after it was trained: it must still be loaded.
KEEP_ADAPTERS = 8


@dataclass(frozen=True)
class StackOptions:
    workdir: Path
    model: str | None  # HF directory or .gguf (None: the bundled SmolLM2)
    shadow_fraction: float
    shadow_samples: int
    groups_per_step: int
    rollback_min_trajectories: int
    llm_port: int
    port: int

    @property
    def proxy_root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store(self) -> str:
        return f"sqlite:///{self.workdir / 'art.db'}"


def services(options: StackOptions) -> tuple[Part, Part]:
    """local-llm and the proxy, in start order, as `art-proxy up` plans them, plus shadowing."""
    settings = UpSettings(
        model=options.model, store=options.store, port=options.port, llm_port=options.llm_port
    )
    llm, proxy = plan(settings)
    proxy.argv += flags(
        default_split="prod",
        shadow_fraction=options.shadow_fraction,
        shadow_samples=options.shadow_samples,
    )
    return llm, proxy


def trainer(options: StackOptions) -> Part:
    """The training sidecar; it has no health check (the rounds wait for its steps instead)."""
    argv = [str(Path(sys.executable).parent / "art-proxy"), "train"]
    argv += flags(
        store=options.store,
        proxy=options.proxy_root,
        upstream=f"http://127.0.0.1:{options.llm_port}/v1",
        model=options.model,
        alias=CANDIDATE_ALIAS,
        promote_alias=PROD_ALIAS,
        rollback_min_trajectories=options.rollback_min_trajectories,
        reward_source="finish",  # the users' and the rater's rewards, set at finish
        # Every group here exists whole before any member finishes (a served call and its shadow
        # samples; a round's val answers, started together): ready once none is open.
        group_size=2,
        groups_per_step=options.groups_per_step,
        keep_adapters=KEEP_ADAPTERS,
        out=options.workdir / "trainer",
        run=RUN,
        poll=0.5,
    )
    return Part("trainer", argv, None, ready_timeout_s=0, color="yellow")
