"""The whole loop: step after step until a stop condition, fed its groups by the user's agent;
what both loops share (the events they report, when they stop, the warm start). The sidecar, fed
by the store, is `sidecar.py`; one step itself is `trainer.Trainer.train`.

Whole loop: each step runs the agent `group_size` times on `groups_per_step` training scenarios
through the proxy (the alias serves the newest adapter), scores the groups (RULER with --judge,
else the rewards the agent returned), and refills with more scenarios when too few groups carry a
signal (a base model that fails every rollout of a scenario teaches nothing: DAPO's dynamic
sampling). Every `val_every` steps the validation scenarios run too, on the weights the step
starts from: alternating, before the step and recorded with it; overlapped
(`--max-off-policy-steps`), beside the steps, recorded with the first one taken after they end
(`val_of_step` names the weights). Each group sampled for training is written to the run's ledger
(ledger.py) before it is judged, so a resumed run trains first on what it never consumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from art_proxy.config import TrainSettings
from art_proxy.errors import ConfigError
from art_proxy.records import Judgment, TrainableGroup, TrainingStep
from art_proxy.rewards import has_signal, mean_or_nan, rewards_by_trajectory
from art_proxy.rollout import (
    Agent,
    GroupReport,
    RolloutReport,
    ready_for_judging,
    run_rollouts,
)
from art_proxy.ruler.check import check_judgments
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.scenarios import Scenario
from art_proxy.store.trajectory_store import utcnow
from art_proxy_trainer.advantages import pooled, pooled_rewards
from art_proxy_trainer.errors import RolloutsFailed
from art_proxy_trainer.ledger import SampledGroups
from art_proxy_trainer.pipeline import Pipeline
from art_proxy_trainer.trainer import Trainer
from art_proxy_trainer.warm_start import WarmStart

log = logging.getLogger(__name__)

# The whole loop draws at most this many batches of scenarios for one step before it trains on
# what it has (or records a step without signal).
_MAX_REFILLS = 4


@dataclass
class Events:
    """How the loops report to the display (the command's rich progress)."""

    status: Callable[[str], None] = lambda _text: None
    step: Callable[[TrainingStep], None] = lambda _record: None
    rollouts: Callable[[int, int], None] = lambda _done, _total: None
    warning: Callable[[str], None] = lambda _text: None  # a line the user must read


def failed_rollouts(report: RolloutReport, step: int) -> str | None:
    """What to say when every rollout of `report` failed (None: some did not): the first error
    and the count. Raises `RolloutsFailed` when they all failed with one error: the next step's
    would fail the same way."""
    errors = [error for group in report.groups for error in group.errors.values()]
    if not errors or len(errors) < report.rollouts:
        return None
    if len(set(errors)) == 1:
        raise RolloutsFailed(
            f"every rollout of step {step} failed ({len(errors)} of {report.rollouts}) with: "
            f"{errors[0]}"
        )
    return f"step {step}: all {len(errors)} rollouts failed, the first: {errors[0]}"


def stop_reason(trainer: Trainer, settings: TrainSettings) -> str | None:
    if settings.sft_only and trainer.state.sft_steps:
        return f"warm start done ({trainer.state.sft_steps} steps, --sft-only)"
    if settings.steps and trainer.state.step - trainer.state.sft_steps >= settings.steps:
        return f"reached --steps {settings.steps}"
    if trainer.stopping.plateaued():
        return (
            f"validation reward has not improved by {settings.min_delta} for "
            f"{settings.patience} validations (best {trainer.state.best_val:.3f} at step "
            f"{trainer.state.best_step})"
        )
    return None


async def run_warm_start(trainer: Trainer, warm_start: WarmStart, events: Events) -> None:
    """The warm-start steps the run has not taken yet."""
    while trainer.state.sft_steps < warm_start.steps:
        index = trainer.state.sft_steps
        events.status(f"warm start: step {index + 1} of {warm_start.steps}")
        record = await trainer.train_sft(
            warm_start.batch(index), extra_metrics={"sft_epoch": float(warm_start.epoch(index))}
        )
        events.step(record)


class WholeLoop:
    def __init__(
        self,
        trainer: Trainer,
        settings: TrainSettings,
        agent: Agent,
        scenarios: Sequence[Scenario],
        ruler: Ruler | None,
        events: Events,
        warm_start: WarmStart | None = None,
    ) -> None:
        self.trainer = trainer
        self.warm_start = warm_start
        self.settings = settings
        self.agent = agent
        self.train_scenarios = [s for s in scenarios if s.split == "train"]
        self.val_scenarios = [s for s in scenarios if s.split == "val"]
        self.ruler = ruler
        self.events = events
        self._draws: list[Scenario] = []
        self._random = random.Random(settings.seed)
        # The judge check (ruler/check.py): the judgments of the first step's groups, and the
        # agent's own rewards of their members where it returned them.
        self._unchecked = ruler is not None and settings.judge_check
        self._judgments: list[Judgment] = []
        self._known: dict[str, float] = {}
        self._ledger = SampledGroups(Path(settings.out))

    async def run(self) -> str:
        trainer, settings = self.trainer, self.settings
        validating = bool(self.val_scenarios) and settings.val_every > 0
        if validating and trainer.state.step == 0 and not trainer.state.val_history:
            reward, val_groups = await self.validate()
            await trainer.validated_only(reward, val_groups)
            self.events.status(f"validation reward of the base model: {reward:.3f}")
        if self.warm_start is not None:
            await run_warm_start(trainer, self.warm_start, self.events)
        left = await self._left_behind()
        if left and stop_reason(trainer, settings) is None:
            self.events.status(
                f"training step {trainer.state.step + 1} on {len(left)} groups "
                "sampled before the restart"
            )
            record = await trainer.train(left, extra_metrics={"resumed_groups": float(len(left))})
            self.events.step(record)
        if settings.max_off_policy_steps:
            return await self._run_overlapped()
        while (reason := stop_reason(trainer, settings)) is None:
            number = trainer.state.step + 1
            groups, rollout_metrics = await self._training_groups(number)
            if self._validates(number):
                val_reward, val_groups = await self.validate()
                rollout_metrics["val_reward"] = val_reward
                groups += val_groups
            self._check_judge()
            self.events.status(f"training step {number}")
            self.events.step(await trainer.train(groups, extra_metrics=rollout_metrics))
        return reason

    def _check_judge(self) -> None:
        """Once, before the first step trains: stop when the judge's scores of the groups made
        so far follow position or noise (`--judge-check-below`; `--no-judge-check` skips it)."""
        if not self._unchecked:
            return
        self._unchecked = False
        check = check_judgments(self._judgments, self._known, self.settings.judge_check_below)
        if check.failed:
            raise ConfigError(f"{check.line()}; or train on it anyway: --no-judge-check")
        log.info("%s", check.line())

    def _validates(self, number: int) -> bool:
        """Whether step `number` is validated. The first GRPO step after a warm start is,
        always: its reward is the warm start's (a step's validation is that of the policy that
        sampled its rollouts)."""
        state, settings = self.trainer.state, self.settings
        if not (self.val_scenarios and settings.val_every > 0):
            return False
        after_warm_start = state.sft_steps > 0 and number == state.sft_steps + 1
        return number % settings.val_every == 0 or after_warm_start

    async def _run_overlapped(self) -> str:
        """Steps trained while later steps' rollouts run (pipeline.py). A validation due at a
        step starts when the step before it has been taken, on the weights the step starts
        from (those the alternating loop validates there), and runs beside the batches and the
        steps (`_Validations`), so that it holds none of them up."""
        trainer, settings = self.trainer, self.settings
        taken = trainer.state.step - trainer.state.sft_steps
        validations = _Validations(self)
        pipeline = Pipeline(
            self._training_groups,
            first=trainer.state.step + 1,
            max_off_policy_steps=settings.max_off_policy_steps,
            batches=max(settings.steps - taken, 0) if settings.steps else None,
        )
        pipeline.start()
        try:
            while (reason := stop_reason(trainer, settings)) is None:
                if self._validates(trainer.state.step + 1):
                    # The weights the step starts from, as the alternating loop validates them.
                    validations.start()
                batch = await pipeline.take()
                self._check_judge()
                self.events.status(f"training step {batch.number}")
                last = settings.steps and batch.number - trainer.state.sft_steps >= settings.steps
                record = await trainer.train(
                    batch.groups,
                    extra_metrics=batch.metrics,
                    validations=validations.finished(),
                    # The run's last step: what validation is still running ends beside it.
                    pending=validations.remaining() if last else None,
                )
                pipeline.stepped(
                    moved_weights=record.status == "applied", served=record.swap == "swapped"
                )
                self.events.step(record)
        finally:
            await pipeline.aclose()
            await validations.aclose()
        return reason

    async def _left_behind(self) -> list[TrainableGroup]:
        """The groups this run sampled for training (its ledger, ledger.py) and never trained,
        before it was killed: those finished with rewards, or judged (with a judge: those not
        judged yet are judged now). None were guided (the ledger leaves retries out)."""
        trainer = self.trainer
        sampled = self._ledger.group_ids()
        if not sampled:
            return []
        left = set(sampled) - await trainer.store.consumed_group_ids(self.settings.run_name)
        if not left:
            return []
        source: Literal["finish", "judgment"] = "finish" if self.ruler is None else "judgment"
        found = await self._trainable(source, left)
        if self.ruler is not None:
            for group_id in sorted(left - {group.group_id for group in found}):
                members = await finished_members(self.ruler.store, group_id)
                await self.ruler.score_group(group_id, members)
            found = await self._trainable(source, left)
        return [group for group in found if group.split == "train" and len(group.rewards) >= 2]

    async def _trainable(
        self, source: Literal["finish", "judgment"], groups: set[str]
    ) -> list[TrainableGroup]:
        return await self.trainer.store.trainable_groups(
            self.settings.run_name,
            source=source,
            limit=len(groups),
            scenarios=[scenario.id for scenario in self.train_scenarios],
            groups=sorted(groups),
        )

    async def validate(self) -> tuple[float, list[TrainableGroup]]:
        """Mean reward of the current policy on the validation scenarios."""
        self.events.status("validating")
        groups = await self._scored_groups(self.val_scenarios)
        rewards = [r for g in groups for r in g.rewards.values()]
        return mean_or_nan(rewards), groups

    async def _training_groups(self, number: int) -> tuple[list[TrainableGroup], dict[str, float]]:
        groups: list[TrainableGroup] = []
        metrics = (
            {"guided_retries": 0.0, "guided_rescued": 0.0} if self.settings.guided_retries else {}
        )
        rounds = 0
        started = time.perf_counter()
        while rounds < _MAX_REFILLS:
            # With a teacher every group teaches (its term needs no reward spread): no refills.
            with_signal = sum(
                self.settings.distils or has_signal(pooled_rewards(members).values())
                for members in pooled(groups).values()
            )
            missing = self.settings.groups_per_step - with_signal
            if missing <= 0:
                break
            rounds += 1
            self.events.status(f"step {number}: rollouts, round {rounds}")
            drawn = await self._scored_groups(self._draw(missing))
            groups += drawn
            if self.settings.guided_retries:
                retried = await self._guided_retries(drawn)
                groups += retried
                metrics["guided_retries"] += len(retried)
                # Rescued: the retry, pooled with the group it retried, has a signal to train.
                pools = pooled(drawn + retried)
                metrics["guided_rescued"] += sum(
                    has_signal(pooled_rewards(pools.get(retry.baseline_group or "", [])).values())
                    for retry in retried
                )
        metrics["rollout_rounds"] = float(rounds)
        metrics["rollouts"] = float(sum(len(group.members) for group in groups))
        metrics["seconds_rollouts"] = time.perf_counter() - started
        return groups, metrics

    async def _guided_retries(self, groups: Sequence[TrainableGroup]) -> list[TrainableGroup]:
        """The groups of `groups` whose rollouts all failed, run again with their guidance (the
        scenario's hint, else --guide; none: not retried)."""
        settings = self.settings
        by_id = {scenario.id: scenario for scenario in self.train_scenarios}
        guidance: dict[str, str] = {}
        retried: dict[str, str] = {}  # scenario id -> the unguided group
        for group in groups:
            rewards = list(group.rewards.values())
            if len(rewards) < 2 or max(rewards) > settings.guide_below:
                continue
            scenario = by_id.get(group.scenario_id)
            text = (scenario.hint if scenario is not None else None) or settings.guide
            if scenario is not None and text:
                guidance[scenario.id] = text
                retried[scenario.id] = group.group_id
        if not guidance:
            return []
        guided = await self._scored_groups([by_id[i] for i in guidance], guidance)
        return [
            group.model_copy(update={"baseline_group": retried[group.scenario_id]})
            for group in guided
        ]

    def _draw(self, count: int) -> list[Scenario]:
        """The next training scenarios, each epoch in a new random order."""
        drawn: list[Scenario] = []
        while len(drawn) < count and self.train_scenarios:
            if not self._draws:
                self._draws = list(self.train_scenarios)
                self._random.shuffle(self._draws)
            drawn.append(self._draws.pop())
        return drawn

    async def _scored_groups(
        self,
        scenarios: Sequence[Scenario],
        guidance: Mapping[str, str] | None = None,
        model: str | None = None,
    ) -> list[TrainableGroup]:
        settings = self.settings
        report = await run_rollouts(
            self.agent,
            scenarios,
            proxy_url=settings.proxy,
            group_size=settings.group_size,
            concurrency=settings.concurrency,
            timeout_s=settings.rollout_timeout,
            model=model or self.trainer.alias,
            admin_key=settings.admin_key,
            progress=self.events.rollouts,
            guidance=guidance,
        )
        for warning in report.warnings:
            log.warning("%s", warning)
        said = failed_rollouts(report, self.trainer.state.step + 1)
        if said is not None:
            self.events.warning(said)
        if guidance is None:  # the run's own, before judging: a kill now loses none of them
            self._ledger.add([group for group in report.groups if group.split == "train"])
        scored = [await self._score(group) for group in report.groups]
        return [group for group in scored if group is not None]

    async def _score(self, group: GroupReport) -> TrainableGroup | None:
        if not ready_for_judging(group):
            return None
        succeeded = set(group.succeeded)
        rewards: dict[str, float] = {}
        cost = 0.0
        if self.ruler is None:
            rewards = {t: r for t, r in group.rewards.items() if t in succeeded and r is not None}
        else:
            members = await finished_members(self.ruler.store, group.group_id)
            judgment = await self.ruler.score_group(group.group_id, members)
            if self._unchecked:
                self._judgments.append(judgment)
                self._known |= {m.trajectory_id: m.reward for m in members if m.reward is not None}
            cost = judgment.cost_usd
            if judgment.status == "scored":
                rewards = rewards_by_trajectory(judgment.scores)
            else:
                log.warning("group %s: %s (%s)", group.group_id, judgment.status, judgment.reason)
        if len(rewards) < 2:
            return None
        return TrainableGroup(
            group_id=group.group_id,
            scenario_id=group.scenario_id,
            split=group.split,
            created_at=utcnow(),
            rewards=rewards,
            judge_cost_usd=cost,
        )


class _Validations:
    """The overlapped loop's validations, each beside the batches: sampled on the adapter the
    alias serves when it starts (named, so a swap meanwhile moves none of its rollouts; held
    loaded until it ends), recorded with the first step taken after it ends, against those
    weights (the step's `val_of_step`)."""

    def __init__(self, loop: WholeLoop) -> None:
        self._loop = loop
        self._running: list[asyncio.Task[list[TrainableGroup]]] = []

    def start(self) -> None:
        swapper = self._loop.trainer.swapper
        model = swapper.serving if swapper is not None else self._loop.trainer.alias
        self._running.append(
            asyncio.create_task(self._validate(model), name="art-proxy-validation")
        )

    async def _validate(self, model: str) -> list[TrainableGroup]:
        swapper = self._loop.trainer.swapper
        with swapper.holding(model) if swapper is not None else contextlib.nullcontext():
            # No status line: the trainer's steps go on meanwhile, and the display says those.
            return await self._loop._scored_groups(self._loop.val_scenarios, model=model)

    def finished(self) -> list[list[TrainableGroup]]:
        """The validations that have ended, oldest first, taken (a step records them); a
        failed one fails the run, as it did inside a batch."""
        done = [task for task in self._running if task.done()]
        self._running = [task for task in self._running if not task.done()]
        return [task.result() for task in done]

    async def remaining(self) -> list[list[TrainableGroup]]:
        """Every validation still running, once ended, oldest first (the last step's)."""
        running, self._running = self._running, []
        return [await task for task in running]

    async def aclose(self) -> None:
        for task in self._running:
            task.cancel()
        for task in self._running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._running.clear()
