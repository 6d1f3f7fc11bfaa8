"""Safe promotion and automatic rollback of a production alias (`--promote-alias`).

A production alias (what production agents call) moves only on evidence, while the training alias
moves every step. Promotion: a validated adapter replaces the alias's target when its validation
reward is at least the target's (equal promotes: the newer adapter has seen more data). Rollback:
once the promoted target has served enough scored production trajectories, a live mean below the
previous target's (over that target's own serving period) by more than a margin moves the alias
back. Each decision (`decide_promotion`, `decide_rollback`: rules without I/O) carries its evidence
as a one-line note, which the trainer records with the move or the step.

With a canary (`--canary-fraction F`), a validated candidate does not take the alias over: it serves
a share F of the alias's new trajectories beside the target (the proxy draws each trajectory's arm
from its id; a trajectory stays on its arm), and after every poll the anytime-valid interval of
`canary` on the difference in live reward decides: promote, roll back, keep the target (no
difference worth acting on), or look again. Both arms are measured on the same traffic at the same
time, so the comparison is of the adapters, not of two periods. With several shares
(`--canary-fraction 0.05 --canary-fraction 0.25`), a stage still holding once it has served
`--canary-stage-trajectories` scored trajectories on the candidate widens to the next (a `canary`
move); the evidence is kept across stages, stratified by them (`canary`).

Before a canary starts, the newest shadow samples the target drew (`--canary-gate-samples`) give an off-policy estimate of the
candidate's reward (`counterfactual`): the candidate and the target each score the samples' tokens
(`prompt_logprobs` upstream, the same numerics for both), and a candidate the estimate disfavours
is held back before any user is served by it; the estimate is kept in the canary's move note.
Samples drawn from an altered distribution (a temperature other than 1, top-k/top-p/min-p, a
penalty, a logit bias, a grammar) are left out: raw logprobs are not what they were drawn from.

The alias's history is the store's alias moves, so a restarted trainer picks it up where it was:
the newest move says what the alias serves and since when, and a `promote` move's `previous` is the
rollback target, pinned upstream until the alias moves on. An adapter is a candidate right after
the step that validated it; one rolled back is never promoted again in the run (the trainer's state
keeps it across a resume).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import torch

from art_proxy.guided_decoding import constraint
from art_proxy.records import (
    MAX_NOTE,
    AliasMove,
    AliasRecord,
    AliasRequest,
    CallRecord,
    CanaryLook,
    CanaryVerdict,
    LiveReward,
    MoveReason,
)
from art_proxy.store.base import utcnow
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.teacher import Teacher, TeacherError
from art_proxy_trainer.canary import (
    MIN_PER_ARM,
    VERDICTS,
    ArmRewards,
    CanaryPolicy,
    Interval,
    Stage,
    verdict,
)
from art_proxy_trainer.checkpoint import TrainerState
from art_proxy_trainer.counterfactual import ScoredSample, gate, off_policy_estimate
from art_proxy_trainer.errors import SwapError
from art_proxy_trainer.sampled import NOT_FILTERED, sampled_from
from art_proxy_trainer.swap import AdapterSwapper, step_of, step_of_run

MAX_STAGES = 100  # an alias's newest moves read for a canary's stages


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


# One stage of a canary's evidence: its share, and each arm's live reward while it served it.
StageRewards = tuple[float, LiveReward, LiveReward]


def decide_canary(
    stages: Sequence[StageRewards], policy: CanaryPolicy
) -> tuple[CanaryVerdict, str, Interval]:
    """A canary's verdict on the live rewards of its stages (oldest first, the running one
    last), its evidence line and interval."""
    decided, bounds = verdict(
        [Stage(share, arm_rewards(c), arm_rewards(t)) for share, c, t in stages],
        alpha=policy.alpha,
        min_effect=policy.min_effect,
    )
    candidate = pooled([c for _, c, _ in stages])
    current = pooled([t for _, _, t in stages])
    pending = candidate.pending + current.pending
    share = stages[-1][0]
    note = (
        f"live {candidate.mean or 0:.2f} (n={candidate.count}, {candidate.model}) vs "
        f"{current.mean or 0:.2f} (n={current.count}, {current.model})"
    )
    if counted(stages):
        note += (
            f": difference {float(bounds.difference):+.3f} [{float(bounds.low):+.3f}, "
            f"{float(bounds.high):+.3f}] at alpha {policy.alpha:g}"
        )
    if len(policy.fractions) > 1:
        note += f" (stage {policy.stage(share) + 1} of {len(policy.fractions)}, {share:.0%})"
    if pending:
        note += f", {pending} awaiting a reward"
    if not counted(stages):
        note += f"; at least {MIN_PER_ARM} scored trajectories an arm before deciding"
    return VERDICTS[int(decided)], note, bounds


def counted(stages: Sequence[StageRewards]) -> bool:
    """Whether any stage has enough scored on each arm to count (an interval to show)."""
    return any(min(c.count, t.count) >= MIN_PER_ARM for _, c, t in stages)


def pooled(stages: Sequence[LiveReward]) -> LiveReward:
    """One arm's live reward over all its stages (what the page and the note show)."""
    count = sum(live.count for live in stages)
    total = math.fsum((live.mean or 0.0) * live.count for live in stages)
    squares = math.fsum((live.mean_square or 0.0) * live.count for live in stages)
    return LiveReward(
        model=stages[0].model,
        count=count,
        mean=total / count if count else None,
        mean_square=squares / count if count else None,
        pending=sum(live.pending for live in stages),
    )


def arm_rewards(live: LiveReward) -> ArmRewards:
    """One arm's evidence as the canary's interval takes it."""
    count = float(live.count)
    return ArmRewards(
        torch.tensor(count, dtype=torch.float64),
        torch.tensor((live.mean or 0.0) * count, dtype=torch.float64),
        torch.tensor((live.mean_square or 0.0) * count, dtype=torch.float64),
    )


class Promoter:
    def __init__(
        self,
        alias: str,
        store: TrajectoryStore,
        swapper: AdapterSwapper,
        *,
        min_trajectories: int,
        margin: float,
        canary: CanaryPolicy | None = None,
        upstream: str | None = None,
        upstream_api_key: str | None = None,
    ) -> None:
        self.alias = alias
        self._upstream = upstream  # where the off-policy gate scores shadow samples
        self._upstream_api_key = upstream_api_key
        self._store = store
        self._swapper = swapper
        self._min_trajectories = min_trajectories
        self._margin = margin
        self._canary = canary
        self._stuck: str | None = None  # a target that should roll back to an unloaded one
        self._looked: object = None  # the evidence of the last canary look

    async def start(self) -> None:
        """Point a new production alias at the base model (the target a first promotion is
        measured against and rolls back to); pin the rollback target of an existing one."""
        if await self._moves():
            return
        error = await self._move(
            self._swapper.base_name, "promote", "the base model, before any adapter"
        )
        if error is not None:
            raise SwapError(error)

    async def consider(self, validated: Mapping[str, float], state: TrainerState) -> str | None:
        """Promote the newest adapter this step validated (served model -> validation reward)
        when the evidence says so; a line for the step's record (None: nothing was up)."""
        alias, tag = self._swapper.alias, self._swapper.run_tag
        ours = [model for model in validated if step_of_run(model, alias, tag) is not None]
        if not ours:  # nothing validated, or only another run's adapters
            return None
        candidate = max(ours, key=lambda model: step_of(model, alias))
        moves = await self._moves()
        current = moves[0].model if moves else self._swapper.base_name
        if candidate == current:
            return None
        if not self._swapper.holds(candidate):
            return f"not promoted: {candidate} is no longer loaded upstream"
        if self._canary is not None:  # the canary, not validation, decides
            return await self._start_canary(candidate, current, validated[candidate], state)
        decision = decide_promotion(
            validated[candidate],
            current,
            state.validated.get(current),
            rolled_back=candidate in state.rolled_back,
        )
        if not decision.act:
            return f"kept {current} over {candidate}: {decision.note}"
        error = await self._move(candidate, "promote", decision.note)
        if error is not None:
            return f"not promoted: {error}"
        self._swapper.pinned = {current}
        return f"promoted {candidate} to {self.alias}: {decision.note}"

    async def _start_canary(
        self, candidate: str, current: str, val: float, state: TrainerState
    ) -> str | None:
        """Serve `candidate` to the canary's share of new trajectories beside `current`, unless
        a canary is deciding already (it finishes first) or it was rolled back before."""
        assert self._canary is not None  # the caller checks
        if candidate in state.rolled_back:
            return f"no canary for {candidate}: rolled back earlier in this run"
        running = await self._running_canary()
        if running is not None:
            if running.canary == candidate:
                return None
            return f"{candidate} waits: the canary of {running.canary} is still deciding"
        current_val = state.validated.get(current)
        if current_val is not None and val < current_val - self._canary.min_effect:
            return (
                f"no canary for {candidate}: val {val:.2f} below {current_val:.2f} ({current}) by "
                f"more than {self._canary.min_effect:g}"
            )
        share = self._canary.fractions[0]
        note = f"val {val:.2f}; {share:.0%} of new trajectories beside {current}"
        if self._canary.gate_samples > 0 and self._upstream is not None:
            passes, evidence = await self._off_policy_gate(candidate, current)
            if not passes:
                return f"no canary for {candidate}: {evidence}"
            note = f"{note}; {evidence}"
        error = await self._move(candidate, "canary", note, fraction=share)
        if error is not None:
            return f"no canary for {candidate}: {error}"
        return f"canary {candidate} on {share:.0%} of {self.alias}'s new trajectories: {note}"

    async def _off_policy_gate(self, candidate: str, current: str) -> tuple[bool, str]:
        """The off-policy estimate of `candidate` on the shadow samples `current` drew: whether
        a canary may start, and the evidence line."""
        assert self._canary is not None and self._upstream is not None  # the caller checks
        rewards = await self._store.shadow_rewards(current, self._canary.gate_samples)
        calls = await self._store.calls(list(rewards))
        usable = [
            (calls[trajectory][0], reward)
            for trajectory, reward in rewards.items()
            if trajectory in calls and _reweighable(calls[trajectory][0])
        ]
        try:
            async with (
                Teacher(self._upstream, candidate, self._upstream_api_key) as scorer,
                Teacher(self._upstream, current, self._upstream_api_key) as sampler,
            ):
                scored = await asyncio.gather(
                    *(_token_logprobs((scorer, sampler), call) for call, _ in usable)
                )
        except TeacherError as exc:  # the canary itself is the evidence then
            return True, f"no off-policy estimate ({exc})"
        samples = [
            ScoredSample(reward, pair[0], pair[1])
            for (_, reward), pair in zip(usable, scored, strict=True)
            if pair is not None
        ]
        on_policy = math.fsum(s.reward for s in samples) / len(samples) if samples else math.nan
        passes, evidence = gate(off_policy_estimate(samples), on_policy, self._canary.min_effect)
        if len(samples) < len(rewards):
            evidence = f"{evidence} ({len(rewards) - len(samples)} samples could not be reweighed)"
        return passes, evidence

    async def _running_canary(self) -> AliasRecord | None:
        record = next((r for r in await self._store.aliases() if r.alias == self.alias), None)
        if record is None or record.canary is None:
            return None
        self._swapper.pinned = self._swapper.pinned | {record.canary}  # loaded while it decides
        return record

    async def _stages(self, record: AliasRecord) -> list[StageRewards]:
        """The running canary's stages, oldest first: each one's share and the live rewards of
        the trajectories that began while it ran (a widening is a `canary` move of its own)."""
        assert record.canary is not None and record.canary_since is not None  # the caller's
        moves = await self._store.alias_moves(self.alias, limit=MAX_STAGES)
        starts: list[tuple[datetime, float | None]] = [
            (move.moved_at, move.fraction)
            for move in reversed(moves)
            if move.reason == "canary"
            and move.model == record.canary
            and move.moved_at >= record.canary_since
        ] or [(record.canary_since, record.canary_fraction)]
        ends = [since for since, _ in starts[1:]] + [None]
        stages: list[StageRewards] = []
        for (since, share), until in zip(starts, ends, strict=True):
            live = await self._store.live_rewards(since=since, until=until, alias=self.alias)
            stages.append(
                (
                    share or record.canary_fraction,
                    live.get(record.canary) or LiveReward(model=record.canary, count=0, mean=None),
                    live.get(record.model) or LiveReward(model=record.model, count=0, mean=None),
                )
            )
        return stages

    async def _watch_canary(self, state: TrainerState) -> str | None:
        """Decide the running canary, if any, on the live rewards since it began."""
        assert self._canary is not None  # the caller checks
        record = await self._running_canary()
        if record is None or record.canary is None:
            return None
        candidate, current = record.canary, record.model
        if not 0 < record.canary_fraction < 1:  # set by hand: no arm to compare with
            if self._stuck == candidate:
                return None  # said once; the sidecar asks every poll
            self._stuck = candidate
            return (
                f"the canary of {candidate} serves {record.canary_fraction:.0%} of {self.alias}'s "
                f"new trajectories, so {current} serves none to compare it with: move the alias, "
                "or give the canary a share below 1"
            )
        stages = await self._stages(record)
        arms = (pooled([c for _, c, _ in stages]), pooled([t for _, _, t in stages]))
        share = record.canary_fraction
        verdict_, note, bounds = decide_canary(stages, self._canary)
        if (record.canary_since, stages) != self._looked:  # what the page and /metrics show
            ready = counted(stages)
            look = CanaryLook(
                alias=self.alias,
                looked_at=utcnow(),
                fraction=record.canary_fraction,
                candidate=arms[0],
                target=arms[1],
                # Before any stage counts, the arms' own means (no interval to go with them).
                difference=float(bounds.difference)
                if ready
                else (arms[0].mean or 0.0) - (arms[1].mean or 0.0),
                low=float(bounds.low) if ready else None,
                high=float(bounds.high) if ready else None,
                verdict=verdict_,
                note=note[:MAX_NOTE],
            )
            await self._store.add_canary_look(look)
            self._looked = (record.canary_since, stages)
        scored = arms[0].count + arms[1].count
        if verdict_ == "hold" and scored >= self._canary.max_trajectories:
            verdict_ = "keep"  # undecided for too long: the target stays, a newer one may try
            note = f"{note}; undecided after {scored} scored trajectories"
        if verdict_ == "hold":
            wider = self._canary.widens(share, stages[-1][1].count)
            if wider is None:
                return None
            error = await self._move(
                candidate, "canary", note, fraction=wider, canary_since=record.canary_since
            )
            if error is not None:
                return f"the canary of {candidate} could not widen to {wider:.0%}: {error}"
            return f"canary {candidate} widened to {wider:.0%} of {self.alias}'s new trajectories: {note}"
        began = record.canary_since
        if verdict_ == "promote":
            error = await self._move(candidate, "promote", note, canary_since=began)
            said = f"promoted {candidate} to {self.alias} after its canary: {note}"
        else:
            reason: MoveReason = "rollback" if verdict_ == "rollback" else "kept"
            error = await self._move(current, reason, note, canary_since=began)
            if verdict_ == "rollback":
                said = f"canary {candidate} rolled back, {self.alias} stays on {current}: {note}"
            else:
                said = f"canary {candidate} ended, no difference worth acting on: {note}"
        if error is not None:  # the next poll decides again
            return f"the canary of {candidate} decided ({verdict_}) but the move failed: {error}"
        if verdict_ == "rollback" and candidate not in state.rolled_back:
            state.rolled_back.append(candidate)
        self._swapper.pinned = set()
        return said

    async def watch(self, state: TrainerState) -> str | None:
        """Roll the alias back to its previous target when the live reward of the promoted one
        has fallen; with a canary, decide it. A line saying what moved (None: nothing)."""
        if self._canary is not None:
            return await self._watch_canary(state)
        moves = await self._moves()
        if not moves or moves[0].reason != "promote" or moves[0].previous is None:
            return None
        promoted, previous = moves[0], moves[0].previous
        # The previous target's own serving period: from the move to it until the promotion.
        since = moves[1].moved_at if len(moves) > 1 and moves[1].model == previous else None
        live = await self._store.live_rewards(since=promoted.moved_at, alias=self.alias)
        before = await self._store.live_rewards(
            since=since, until=promoted.moved_at, alias=self.alias
        )
        decision = decide_rollback(
            live.get(promoted.model) or LiveReward(model=promoted.model, count=0, mean=None),
            before.get(previous) or LiveReward(model=previous, count=0, mean=None),
            self._min_trajectories,
            self._margin,
        )
        if not decision.act:
            return None
        if not self._swapper.holds(previous):
            if self._stuck == promoted.model:
                return None  # said once; the sidecar asks every poll
            self._stuck = promoted.model
            return f"{self.alias} should roll back, but {previous} is not loaded: {decision.note}"
        error = await self._move(previous, "rollback", decision.note)
        if error is not None:
            return f"rollback of {self.alias} failed: {error}"
        state.rolled_back.append(promoted.model)
        self._swapper.pinned = set()  # the alias itself now holds its target
        return f"{self.alias} rolled back from {promoted.model} to {previous}: {decision.note}"

    async def _moves(self) -> list[AliasMove]:
        """The alias's last two moves, newest first; pins the rollback target they name."""
        moves = await self._store.alias_moves(self.alias, limit=2)
        promoted = bool(moves) and moves[0].reason == "promote" and moves[0].previous is not None
        self._swapper.pinned = {str(moves[0].previous)} if promoted else set()
        return moves

    async def _move(
        self,
        model: str,
        reason: MoveReason,
        note: str,
        *,
        fraction: float | None = None,
        canary_since: datetime | None = None,
    ) -> str | None:
        """Move the alias (`fraction`: start or widen its canary; `canary_since`: the move
        decides the canary that began then, refused if it no longer runs); why it did not move
        (None: moved). An unreachable proxy is data here: the alias stays, and the next step or
        poll tries again."""
        step = step_of(model, self._swapper.alias) or None
        request = AliasRequest(
            model=model,
            step=step,
            reason=reason,
            note=note[:MAX_NOTE],
            fraction=fraction,
            canary_since=canary_since,
        )
        try:
            return await self._swapper.move_alias(self.alias, request)
        except SwapError as exc:
            return str(exc)


def _reweighable(call: CallRecord) -> bool:
    """Whether a shadow sample's tokens were drawn from the model's raw distribution (what
    `prompt_logprobs` gives), with its ids recorded."""
    temperature = call.sampling.get("temperature")
    drawn = temperature is None or (  # greedy decoding is no draw: its weights mean nothing
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and float(temperature) == 1.0
    )
    return (
        drawn
        and call.prompt_token_ids is not None
        and call.completion_token_ids is not None
        and len(call.completion_token_ids) == 1
        and sampled_from(call) == NOT_FILTERED
        and constraint(call.request) is None
    )


async def _token_logprobs(
    scorers: Sequence[Teacher], call: CallRecord
) -> tuple[tuple[float, ...], ...] | None:
    """Each scorer's logprob of the call's sampled tokens (None: one could not score them)."""
    assert call.prompt_token_ids is not None and call.completion_token_ids is not None
    scored = await asyncio.gather(
        *(
            scorer.logprobs((call.id, 0), call.prompt_token_ids, call.completion_token_ids[0])
            for scorer in scorers
        )
    )
    return None if any(s is None for s in scored) else tuple(s for s in scored if s is not None)
