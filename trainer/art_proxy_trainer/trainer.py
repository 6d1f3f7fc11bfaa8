"""The trainer: one training step and its record, and the state around it: resume, validation,
stopping. The loops that call it, step after step, are in `loop`.

`Trainer.train(groups)` turns scored groups into one step and always leaves a record of it, whether
the optimiser moved or not: a group is consumed by exactly one step, including the groups that
carried no signal (equal rewards), were sampled by a too-old adapter (stale), recorded no token ids,
or were validation groups. The order inside a step is what makes a kill at any moment harmless:
train, write the checkpoint (the step's record inside), write the record to the store, then swap.
`resume()` replays whatever of the last two a kill interrupted. With a production alias
(`promoter`), a step first checks whether it must roll back, then offers the adapter its
validation measured for promotion (before the swap, which may unload older adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from art_proxy.config import TrainSettings
from art_proxy.privacy.redaction import redact_url
from art_proxy.records import (
    GroupOutcome,
    StepKind,
    StepStatus,
    TrainableGroup,
    TrainingStep,
)
from art_proxy.rewards import agent_metrics, mean_or_nan, population_std
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.teacher import Teacher, trajectory_contexts
from art_proxy_trainer.batch import (
    NO_TEACHER,
    TeacherLogprobs,
    TrainingBatch,
    TrajectorySample,
    build_batch,
    trained_choices,
    trained_prompt,
)
from art_proxy_trainer.checkpoint import Checkpoints, RunIdentity, TrainerState
from art_proxy_trainer.disagreement import teacher_score
from art_proxy_trainer.errors import CheckpointError, EmptyBatchError
from art_proxy_trainer.memory import release_freed_memory
from art_proxy_trainer.metrics import MetricsSink
from art_proxy_trainer.policy import Policy
from art_proxy_trainer.promoter import Promoter
from art_proxy_trainer.samples import trajectory_samples
from art_proxy_trainer.sleep import UpstreamSleep
from art_proxy_trainer.swap import AdapterSwapper, adapter_name, step_of
from art_proxy_trainer.validation import Stopping, validation_by_model

log = logging.getLogger(__name__)
# Where every step's torch work runs (see `_optimise_batch`).
_TRAINING_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-proxy-train")


class Trainer:
    def __init__(
        self,
        settings: TrainSettings,
        store: TrajectoryStore,
        policy: Policy,
        checkpoints: Checkpoints,
        sink: MetricsSink,
        swapper: AdapterSwapper | None,
        *,
        promoter: Promoter | None = None,
        sleeper: UpstreamSleep | None = None,
        teacher: Teacher | None = None,
        scenario_contexts: Mapping[str, str] | None = None,
        on_warning: Callable[[str], None] = log.warning,
    ) -> None:
        self.settings = settings
        self.store = store
        self.policy = policy
        self.checkpoints = checkpoints
        self.sink = sink
        self.swapper = swapper
        self.promoter = promoter
        self.sleeper = sleeper  # vLLM asleep during each step (the whole loop on one GPU)
        self.teacher = teacher  # scores each sampled token (on-policy distillation)
        # What the teacher is shown of each scenario besides its context (scenario id -> text).
        self.scenario_contexts = scenario_contexts or {}
        self.identity = RunIdentity(
            base_model=policy.served_name,
            store=redact_url(settings.store),
            agent=settings.agent,
            scenarios=settings.scenarios,
        )
        self.state = TrainerState(run=settings.run_name, identity=self.identity)
        if swapper is not None:
            swapper.run_tag = self.state.run_tag
        self.stopping = Stopping(settings.patience, settings.min_delta, on_warning=on_warning)
        self._on_warning = on_warning

    @property
    def alias(self) -> str:
        if self.swapper is not None:
            return self.swapper.alias
        return self.settings.alias or self.policy.served_name

    async def resume(self) -> int:
        """Continue from the latest checkpoint, if any; returns the step it holds (0: none).

        Either way the alias ends up serving this run's newest adapter (loaded again: the
        upstream may have restarted since) or, for a new run, the base model: an alias a previous
        run left on an adapter the upstream no longer holds would fail every agent call.
        """
        state = self.checkpoints.latest()
        if state is None:
            if self.swapper is not None:
                await self.swapper.serve_base()
            return 0
        if state.run != self.settings.run_name:
            raise CheckpointError(
                f"{self.checkpoints.out} holds run {state.run!r}, not {self.settings.run_name!r}"
            )
        warm_start_only = state.step == state.sft_steps
        differences = (
            state.identity.differences(self.identity, warm_start_only=warm_start_only)
            if state.identity
            else []
        )
        if differences and not self.settings.resume:
            raise CheckpointError(
                f"{self.checkpoints.out} holds step {state.step} of another run "
                f"({'; '.join(differences)}): pass --out NEW_DIR to start a run of your own, "
                "or --resume to go on with that one"
            )
        state.identity = self.identity
        self.checkpoints.restore(state, self.policy)
        self.state = state
        if self.swapper is not None:
            self.swapper.run_tag = state.run_tag
        record = state.record
        if record is not None:
            # A kill between the checkpoint and the store: the store learns the step now.
            await self.store.record_step(record)
        if self.swapper is not None:
            record = await self._serve_newest(record)
        if record is not None and self.sink.last_step() < record.step:
            self.sink.write(record)
        return state.step

    async def train(
        self,
        groups: Sequence[TrainableGroup],
        *,
        extra_metrics: Mapping[str, float] = {},
        validations: Sequence[list[TrainableGroup]] = (),
        pending: Awaitable[list[list[TrainableGroup]]] | None = None,
    ) -> TrainingStep:
        """One GRPO step on `groups`; validation groups among them are one validation, recorded
        and not trained, as is each of `validations` (sampled beside the batches, each by one
        adapter). `pending`: validations still being sampled (the overlapped loop's last step),
        awaited once the step has trained and recorded with it."""
        started = time.perf_counter()
        await self.watch_production()
        number = self.state.step + 1
        outcomes: dict[str, GroupOutcome] = {}
        metrics: dict[str, float] = dict(extra_metrics)
        val = [g for g in groups if g.split == "val"]
        measured = [val, *validations] if val else list(validations)
        train_groups = [g for g in groups if g.split in ("train", "prod")]
        # Claimed before their calls are read: an erasure from here on names this step in its
        # lineage until the step is recorded; one before finds its calls gone from the read.
        await self.store.claim_step(
            self.settings.run_name, number, [g.group_id for g in train_groups]
        )
        calls = await self.store.calls([t for g in train_groups for t in g.members])
        samples = trajectory_samples(
            train_groups,
            calls,
            outcomes,
            metrics,
            applied_steps=self.state.applied_steps,
            alias=self.alias,
            run_tag=self.state.run_tag,
            staleness_bound=self.settings.staleness_bound,
            scale_by_std=self.settings.scale_advantages_by_std,
            keep_without_signal=self.teacher is not None,
        )
        shown = trajectory_contexts(train_groups, self.scenario_contexts)
        teacher_scores = await self._teacher_scores(number, samples, metrics, shown)
        metrics["seconds_prepare"] = time.perf_counter() - started
        rewards = [r for g in train_groups for r in g.rewards.values()]
        trained_ids = [t for g in train_groups for t in g.members]
        metrics |= agent_metrics((await self.store.trajectory_metrics(trained_ids)).values())
        metrics |= {
            "reward_mean": mean_or_nan(rewards),
            "reward_std": mean_or_nan([population_std(g.rewards.values()) for g in train_groups]),
        }
        status, reason = await self._optimise(samples, metrics, outcomes, teacher_scores)
        if pending is not None:
            waiting = time.perf_counter()
            measured += await pending
            metrics["pipeline_validation_wait_s"] = time.perf_counter() - waiting
        if rewards:
            self.state.reward_history.append((number, metrics["reward_mean"]))
        promotion, best = await self._validations(measured, outcomes, metrics)
        val = [group for validation in measured for group in validation]
        metrics |= {
            "judge_cost_usd": math.fsum(g.judge_cost_usd for g in [*train_groups, *val]),
            "groups": float(len(train_groups) + len(val)),
            "skipped_groups": float(sum(o != "trained" for o in outcomes.values())),
        }
        return await self._commit(
            number, "grpo", status, reason, outcomes, metrics, started, promotion, best=best
        )

    async def _validations(
        self,
        measured: Sequence[Sequence[TrainableGroup]],
        outcomes: dict[str, GroupOutcome],
        metrics: dict[str, float],
    ) -> tuple[str | None, int | None]:
        """A step's validations, oldest first, each recorded against the weights that served it
        (the step's `val_reward` and `val_of_step` are the newest's): what the production alias
        is offered (`promoter`), and the step now the best validated (None: none of these)."""
        validated_all: dict[str, float] = {}
        best = None
        for val in measured:
            outcomes |= {group.group_id: "validation" for group in val}
            metrics["val_reward"] = mean_or_nan([r for g in val for r in g.rewards.values()])
            calls = await self.store.calls([t for g in val for t in g.rewards])
            validated = validation_by_model(val, calls)
            validated_all |= validated
            weights = self.stopping.served_weights(self.state, validated, self.alias)
            metrics.pop("val_of_step", None)
            if weights is not None:
                metrics["val_of_step"] = float(weights)
            newly = self.stopping.served_validation(self.state, weights, metrics["val_reward"])
            best = best if newly is None else newly
        self.state.validated |= validated_all
        promotion = None
        if self.promoter is not None:
            promotion = await self.promoter.consider(validated_all, self.state)
        return promotion, best

    async def train_sft(
        self, batch: TrainingBatch, *, extra_metrics: Mapping[str, float] = {}
    ) -> TrainingStep:
        """One warm-start step: the likelihood of `batch`'s demonstrated tokens. It is recorded,
        checkpointed and swapped in as a GRPO step is (kind `sft`), and consumes no group."""
        started = time.perf_counter()
        number = self.state.step + 1
        metrics: dict[str, float] = dict(extra_metrics)
        metrics["seconds_prepare"] = time.perf_counter() - started
        settings = self.settings
        if settings.sft_learning_rate is not None:
            settings = settings.model_copy(update={"learning_rate": settings.sft_learning_rate})
        status, reason = await self._optimise_batch(batch, metrics, settings, "sft")
        self.state.sft_steps += 1
        return await self._commit(number, "sft", status, reason, {}, metrics, started)

    async def _commit(
        self,
        number: int,
        kind: StepKind,
        status: StepStatus,
        reason: str | None,
        outcomes: dict[str, GroupOutcome],
        metrics: dict[str, float],
        started: float,
        promotion: str | None = None,
        *,
        best: int | None = None,
    ) -> TrainingStep:
        """Record step `number`: checkpoint, store, swap, metrics, in the order that makes a
        kill at any moment harmless (see the module docstring); `best`: the step whose weights
        are now the best validated."""
        base = [reward for step, reward in self.state.val_history if step == 0]
        if number == 1 and base:
            # The base model's validation, before any step: the first record carries it (the
            # dashboard's point at step 0).
            metrics["val_reward_base"] = base[0]
        record = TrainingStep(
            run=self.settings.run_name,
            step=number,
            kind=kind,
            status=status,
            reason=reason,
            adapter=adapter_name(self.alias, number, self.state.run_tag)
            if status == "applied"
            else None,
            swap="skipped" if status != "applied" or self.swapper is None else None,
            promotion=promotion,
            groups=outcomes,
            metrics=_finite(metrics),
            created_at=utcnow(),
        )
        self.state.step = number
        if status == "applied":
            self.state.policy_step = number
            self.state.applied_steps.append(number)
        self.state.record = record
        saving = time.perf_counter()
        # An abandoned step leaves the weights as they were: no second copy of them.
        trained = self.policy.state() if status == "applied" else None
        self.checkpoints.save(self.policy.model, trained, self.state)
        if best is not None:
            self.checkpoints.mark_best(best)
        await self.store.record_step(record)
        metrics["seconds_checkpoint"] = time.perf_counter() - saving
        if record.swap is None:
            swapping = time.perf_counter()
            record = await self._swap(record)
            metrics["seconds_swap"] = time.perf_counter() - swapping
        metrics["seconds_step"] = time.perf_counter() - started
        record = record.model_copy(update={"metrics": _finite(metrics)})
        self.state.record = record
        self.sink.write(record)
        self._prune()
        return record

    async def validated_only(self, val_reward: float, groups: Sequence[TrainableGroup]) -> None:
        """A validation before the first step (the base model's reward, the plateau baseline,
        and what a first promotion must match)."""
        calls = await self.store.calls([t for g in groups for t in g.rewards])
        self.state.validated |= validation_by_model(groups, calls)
        self.stopping.validated(self.state, self.state.step, val_reward)

    async def watch_production(self) -> None:
        """Roll the production alias back when its live reward has fallen (each step, and
        while the sidecar waits for groups)."""
        if self.promoter is None:
            return
        rolled_back = await self.promoter.watch(self.state)
        if rolled_back is not None:
            self._on_warning(rolled_back)

    async def _teacher_scores(
        self,
        number: int,
        samples: Sequence[TrajectorySample],
        metrics: dict[str, float],
        shown: Mapping[str, str],
    ) -> TeacherLogprobs:
        """The teacher's logprobs of every trained choice of `samples` (none without a
        teacher), asked all at once (the teacher bounds how many run together); its tokens,
        calls, failures, time and the sampled tokens' reverse KL from it go into `metrics`, and
        each choice's summary (`disagreement.teacher_score`) into the store, as step `number`'s."""
        teacher = self.teacher
        if teacher is None:
            return NO_TEACHER
        before = replace(teacher.counters)
        asked = [
            (call, choice)
            for sample in samples
            for call, choice in trained_choices(sample.calls)
            if choice is not None
        ]
        scored = await asyncio.gather(
            *(
                teacher.call_logprobs(
                    call, choice, trained_prompt(call), shown.get(call.trajectory_id)
                )
                for call, choice in asked
            )
        )
        gaps = [
            sampled - taught
            for (call, choice), logprobs in zip(asked, scored, strict=True)
            if logprobs is not None and call.logprobs is not None
            for sampled, taught in zip(call.logprobs[choice], logprobs, strict=True)
        ]
        spent = teacher.counters.minus(before)
        token_text = self.policy.token_text or (lambda token_id: f"<{token_id}>")
        await self.store.record_teacher_scores(
            [
                teacher_score(
                    call,
                    choice,
                    logprobs,
                    run=self.settings.run_name,
                    step=number,
                    teacher=teacher.model,
                    decode=token_text,
                )
                for (call, choice), logprobs in zip(asked, scored, strict=True)
                if logprobs is not None and call.logprobs is not None
            ]
        )
        metrics |= {
            "teacher_kl": mean_or_nan(gaps),
            "teacher_tokens": float(spent.tokens),
            "teacher_calls": float(spent.calls),
            "teacher_failed_calls": float(spent.failed),
            "seconds_teacher": spent.seconds,
        }
        return {
            (call.id, choice): logprobs
            for (call, choice), logprobs in zip(asked, scored, strict=True)
        }

    async def _optimise(
        self,
        samples: list[TrajectorySample],
        metrics: dict[str, float],
        outcomes: dict[str, GroupOutcome],
        teacher: TeacherLogprobs = NO_TEACHER,
    ) -> tuple[StepStatus, str | None]:
        if not samples:
            stale = any(outcome == "stale" for outcome in outcomes.values())
            return "abandoned", "stale" if stale else "no_signal"
        try:
            batch = build_batch(
                samples,
                pad_token_id=self.policy.pad_token_id,
                grammars=self.policy.grammars,
                teacher=teacher,
            )
        except EmptyBatchError:
            for group_id, outcome in outcomes.items():
                if outcome == "trained":
                    outcomes[group_id] = "no_tokens"
            return "abandoned", "no_tokens"
        status, reason = await self._optimise_batch(batch, metrics, self.settings, "grpo")
        if status == "abandoned":
            for group_id, outcome in outcomes.items():
                if outcome == "trained":
                    outcomes[group_id] = "abandoned"
        return status, reason

    async def _optimise_batch(
        self,
        batch: TrainingBatch,
        metrics: dict[str, float],
        settings: TrainSettings,
        kind: StepKind,
    ) -> tuple[StepStatus, str | None]:
        """One training step on `batch`, its measurements added to `metrics`."""
        training = time.perf_counter()
        # Adam's moments after a warm start point the way the demonstrations pulled: GRPO starts
        # its own (an abandoned first GRPO step leaves the kind, so the next one clears again).
        fresh_optimizer = kind == "grpo" and self.state.optimizer_kind == "sft"
        train = functools.partial(
            self.policy.train, batch, settings, fresh_optimizer=fresh_optimizer
        )
        async with self.sleeper.asleep() if self.sleeper else contextlib.nullcontext():
            # A thread: the event loop keeps serving progress and HTTP while torch computes. The
            # same one every step: glibc gives each thread its own heap, and a step's freed
            # tensors kept in a new heap each step grew a CPU trainer's memory step after step
            # until the kernel killed it.
            result = await asyncio.get_running_loop().run_in_executor(_TRAINING_THREAD, train)
            release_freed_memory()
        metrics["seconds_train"] = time.perf_counter() - training
        metrics |= {
            "loss": result.loss,
            "grad_norm": result.grad_norm,
            "tokens": float(batch.trained_tokens),
            "sequences": float(batch.stats.sequences),
            "stitch_misses": float(batch.stats.stitch_misses),
            "skipped_calls": float(batch.stats.skipped_calls),
        }
        for name, rows, warning in result.left_out(self.state.step + 1):
            metrics[name] = float(rows)
            self._on_warning(warning)
        if result.metrics is not None and batch.objective == "sft":
            metrics["entropy"] = result.metrics.entropy
        elif result.metrics is not None:
            metrics |= result.metrics.named(kl=self.settings.kl_coef > 0)
            last = result.last_metrics
            if result.updates > 1 and last is not None:
                # The means above are over the step's updates; the last update's clip and drift
                # show how far the step went from the weights it began with.
                metrics |= {
                    "updates": float(result.updates),
                    "loss_last": result.last_loss,
                    "clip_fraction_last": last.clip_fraction,
                    "update_drift_last": last.update_drift,
                }
        if result.applied:
            self.state.optimizer_kind = kind
            return "applied", None
        return "abandoned", result.reason

    async def _swap(self, record: TrainingStep) -> TrainingStep:
        assert self.swapper is not None
        outcome = await self.swapper.swap(record.step, self.checkpoints.adapter_dir(record.step))
        if outcome.status == "rejected":
            self._on_warning(f"step {record.step}: adapter not swapped in: {outcome.error}")
        await self.store.set_step_swap(record.run, record.step, outcome.status, outcome.error)
        self.state.loaded_adapters = self.swapper.loaded
        return record.model_copy(update={"swap": outcome.status, "swap_error": outcome.error})

    async def _serve_newest(self, record: TrainingStep | None) -> TrainingStep | None:
        """Load this run's newest adapter again and point the alias at it; a swap the kill
        interrupted is finished and recorded."""
        assert self.swapper is not None
        adapters = list(self.state.loaded_adapters)
        pending = record is not None and record.status == "applied" and record.swap is None
        if pending and record is not None and record.adapter not in adapters:
            adapters.append(
                record.adapter or adapter_name(self.alias, record.step, self.state.run_tag)
            )
        if not adapters:
            await self.swapper.serve_base()
            return record
        self.swapper.adopt(adapters[:-1])
        newest = step_of(adapters[-1], self.alias)
        outcome = await self.swapper.swap(newest, self.checkpoints.adapter_dir(newest))
        if outcome.status == "rejected":
            self._on_warning(f"the adapter of step {newest} could not be served: {outcome.error}")
        self.state.loaded_adapters = self.swapper.loaded
        if not pending or record is None:
            return record
        await self.store.set_step_swap(record.run, record.step, outcome.status, outcome.error)
        return record.model_copy(update={"swap": outcome.status, "swap_error": outcome.error})

    def _prune(self) -> None:
        loaded = self.swapper.loaded if self.swapper is not None else []
        keep = {step_of(name, self.alias) for name in loaded}
        self.checkpoints.prune(keep | {self.state.step, self.state.policy_step})


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """NaN and inf say "not measured" here; JSON and the store keep only numbers."""
    return {name: value for name, value in metrics.items() if math.isfinite(value)}
