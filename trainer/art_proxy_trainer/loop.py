"""The whole loop: step after step until a stop condition, fed its groups by the user's agent;
what both loops share (the events they report, when they stop, the warm start). The sidecar, fed
by the store, is `sidecar.py`; one step itself is `trainer.Trainer.train`.

Whole loop: each step runs the agent `group_size` times on `groups_per_step` training scenarios
through the proxy (the alias serves the newest adapter), scores the groups (RULER with --judge,
else the rewards the agent returned), and refills with more scenarios when too few groups carry a
signal (a base model that fails every rollout of a scenario teaches nothing: DAPO's dynamic
sampling). Every `val_every` steps the validation scenarios run too; their reward, recorded with
the step, is that of the policy that sampled the step's training rollouts.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from art_proxy.config import TrainSettings
from art_proxy.errors import ConfigError
from art_proxy.records import Judgment, TrainableGroup, TrainingStep
from art_proxy.rewards import has_signal, mean_or_nan, rewards_by_trajectory
from art_proxy.rollout import Agent, GroupReport, ready_for_judging, run_rollouts
from art_proxy.ruler.check import check_judgments
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.scenarios import Scenario
from art_proxy.store.trajectory_store import utcnow
from art_proxy_trainer.advantages import pooled, pooled_rewards
from art_proxy_trainer.pipeline import Pipeline
from art_proxy_trainer.swap import of_run
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

    async def run(self) -> str:
        trainer, settings = self.trainer, self.settings
        validating = bool(self.val_scenarios) and settings.val_every > 0
        if validating and trainer.state.step == 0 and not trainer.state.val_history:
            reward, val_groups = await self.validate()
            await trainer.validated_only(reward, val_groups)
            self.events.status(f"validation reward of the base model: {reward:.3f}")
        if self.warm_start is not None:
            await run_warm_start(trainer, self.warm_start, self.events)
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
        """Steps trained while later steps' rollouts run (pipeline.py); a resumed run first
        trains on what its killed predecessor sampled and did not train (`_left_behind`)."""
        trainer, settings = self.trainer, self.settings
        left = await self._left_behind() if trainer.state.step > trainer.state.sft_steps else []
        if left and stop_reason(trainer, settings) is None:
            self.events.status(
                f"training step {trainer.state.step + 1} on {len(left)} groups "
                "sampled before the restart"
            )
            record = await trainer.train(left, extra_metrics={"resumed_groups": float(len(left))})
            self.events.step(record)
        taken = trainer.state.step - trainer.state.sft_steps
        pipeline = Pipeline(
            self._overlapped_batch,
            first=trainer.state.step + 1,
            max_off_policy_steps=settings.max_off_policy_steps,
            batches=max(settings.steps - taken, 0) if settings.steps else None,
        )
        pipeline.start()
        try:
            while (reason := stop_reason(trainer, settings)) is None:
                batch = await pipeline.take()
                self._check_judge()
                self.events.status(f"training step {batch.number}")
                record = await trainer.train(batch.groups, extra_metrics=batch.metrics)
                pipeline.stepped()
                self.events.step(record)
        finally:
            await pipeline.aclose()
        return reason

    async def _left_behind(self) -> list[TrainableGroup]:
        """The groups this run sampled ahead of its trainer and never trained, before it was
        killed: training groups of its scenarios, finished with rewards (or judged, with a
        judge), every call served by one of this run's adapters (named with its tag: another
        run's groups, or the base model's before the first step, cannot be told to be this
        run's), none guided (a retry's baseline group is not recorded)."""
        trainer = self.trainer
        found = await trainer.store.trainable_groups(
            self.settings.run_name,
            source="finish" if self.ruler is None else "judgment",
            full_size=self.settings.group_size,
            scenarios=[scenario.id for scenario in self.train_scenarios],
        )
        found = [group for group in found if group.split == "train" and len(group.rewards) >= 2]
        calls = await trainer.store.calls([t for group in found for t in group.rewards])

        def ours(group: TrainableGroup) -> bool:
            made = [call for t in group.rewards for call in calls.get(t, [])]
            return bool(made) and all(
                call.guidance is None
                and call.model is not None
                and of_run(call.model, trainer.alias, trainer.state.run_tag)
                for call in made
            )

        return [group for group in found if ours(group)]

    async def _overlapped_batch(self, number: int) -> tuple[list[TrainableGroup], dict[str, float]]:
        """Step `number`'s groups, its validation sampled beside them (by the same adapter,
        unless a step lands meanwhile: the trainer reads which served each call)."""
        if not self._validates(number):
            return await self._training_groups(number)
        (groups, metrics), (val_reward, val_groups) = await asyncio.gather(
            self._training_groups(number), self.validate()
        )
        return groups + val_groups, metrics | {"val_reward": val_reward}

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
        while rounds < _MAX_REFILLS:
            with_signal = sum(
                has_signal(pooled_rewards(members).values()) for members in pooled(groups).values()
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
        self, scenarios: Sequence[Scenario], guidance: Mapping[str, str] | None = None
    ) -> list[TrainableGroup]:
        settings = self.settings
        report = await run_rollouts(
            self.agent,
            scenarios,
            proxy_url=settings.proxy,
            group_size=settings.group_size,
            concurrency=settings.concurrency,
            timeout_s=settings.rollout_timeout,
            model=self.trainer.alias,
            admin_key=settings.admin_key,
            progress=self.events.rollouts,
            guidance=guidance,
        )
        for warning in report.warnings:
            log.warning("%s", warning)
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
