"""`art-proxy train`: wire the store, the policy, the swapper and a loop; show progress.

Each step prints one line (reward, validation, loss, KL, clip fraction, trainer/sampler mismatch,
tokens, swap, seconds) and the run ends with a one-screen summary. Ctrl-C stops at once: the checkpoints make that safe, and
the next start resumes where the last complete step left off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Table

from art_proxy.config import TrainSettings
from art_proxy.config.judge import judging_as_it_goes
from art_proxy.errors import ConfigError
from art_proxy.journal.left_behind import opened_for_reading
from art_proxy.local.cli import set_torch_threads, usable_cores
from art_proxy.progress_lines import ProgressLines
from art_proxy.records import TrainingStep
from art_proxy.rollout import Agent, load_agent
from art_proxy.ruler.command import build_ruler
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import Rubric, load_rubric
from art_proxy.ruler.scorer import Ruler
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.teacher import Teacher, scenario_contexts, teacher_context
from art_proxy_trainer.canary import CanaryPolicy
from art_proxy_trainer.checkpoint import Checkpoints, TrainerState
from art_proxy_trainer.distributed import Leader, Ranks, Replica, follow, join, leave
from art_proxy_trainer.loop import Events, WholeLoop
from art_proxy_trainer.metrics import MetricsSink
from art_proxy_trainer.policy import Policy, base_dtype, load_policy, training_device
from art_proxy_trainer.promoter import Promoter
from art_proxy_trainer.sidecar import run_sidecar
from art_proxy_trainer.sleep import UpstreamSleep
from art_proxy_trainer.swap import AdapterSwapper
from art_proxy_trainer.trainer import Trainer
from art_proxy_trainer.warm_start import load_warm_start

_COLUMNS = (
    ("step", "step", "{:.0f}"),
    ("reward", "reward_mean", "{:.3f}"),
    ("spread", "reward_std", "{:.3f}"),
    ("val", "val_reward", "{:.3f}"),
    ("loss", "loss", "{:+.3f}"),
    ("kl", "kl", "{:.4f}"),
    ("clip", "clip_fraction", "{:.3f}"),
    ("|dlogp|", "mismatch", "{:.3f}"),
    ("tokens", "tokens", "{:.0f}"),
    ("s", "seconds_step", "{:.1f}"),
    # How many changes of the weights the step's groups were behind at most (production traffic,
    # --max-off-policy-steps), and the seconds the overlapped loop's trainer waited for its batch.
    ("behind", "staleness_max", "{:.0f}"),
    ("wait s", "pipeline_trainer_wait_s", "{:.1f}"),
)
# With --teacher: the sampled tokens' reverse KL from the teacher (it falls as the student learns
# to write as the teacher would).
_TEACHER_COLUMN = ("teach kl", "teacher_kl", "{:.3f}")
_REWARDS_SHOWN = 6  # the summary's reward row: longer runs show the first and the last few


async def run_train(settings: TrainSettings, console: Console) -> TrainSummary:
    """Raises art_proxy errors (config, store, model loading) and TrainerError before training."""
    agent = load_agent(settings.agent) if settings.agent else None
    scenarios = load_scenarios(settings.scenarios) if settings.scenarios else []
    rubric = load_rubric(settings.rubric)
    out = Path(settings.out)
    ranks = Ranks.of_environment()
    set_torch_threads(_threads(settings, ranks))
    with console.status("loading the base model"):
        policy, replica = await asyncio.to_thread(_placed_policy, settings, ranks)
    if replica is not None:
        policy.leader = Leader(replica, settings.collective_timeout)
    try:
        return await _train(settings, console, policy, agent, scenarios, rubric, out)
    finally:
        if policy.leader is not None:
            # The launcher passes a Ctrl-C on to every rank, again: rank 0 has heard it once
            # and now stops the others itself.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            policy.leader.close()
        leave()


def run_follower(settings: TrainSettings, ranks: Ranks) -> None:
    """A rank other than 0: the policy, trained in step with rank 0 until it says stop."""
    set_torch_threads(_threads(settings, ranks))
    replica = None
    try:
        _, replica = _placed_policy(settings, ranks)
        assert replica is not None
        follow(replica)
    finally:
        if replica is not None:
            replica.close()
        leave()


def _threads(settings: TrainSettings, ranks: Ranks | None) -> int:
    """torch threads: --threads, else (0) this machine's cores shared among its ranks."""
    if settings.threads or ranks is None:
        return settings.threads
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))
    return max(1, usable_cores() // local_ranks)


def _placed_policy(settings: TrainSettings, ranks: Ranks | None) -> tuple[Policy, Replica | None]:
    """The policy on this process's device; with several ranks, joined to the others' copies."""
    device = training_device(
        settings.device, settings, ranks.local_rank if ranks is not None else 0
    )
    if ranks is not None:
        join(ranks, settings.collective_timeout, device)
    policy = load_policy(
        settings.model, settings, seed=settings.seed, dtype=base_dtype(settings, device)
    )
    if ranks is None or settings.sharding == "ddp":
        policy.model.to(device)  # a sharded model's shards go to the device as they are made
    if ranks is None:
        return policy, None
    return policy, Replica(policy, ranks, settings.sharding, settings, device)


async def _train(
    settings: TrainSettings,
    console: Console,
    policy: Policy,
    agent: Agent | None,
    scenarios: list[Scenario],
    rubric: Rubric,
    out: Path,
) -> TrainSummary:
    judges: list[LitellmJudge] = []
    summary = TrainSummary(settings, settings.alias or policy.served_name)
    async with opened_for_reading(settings.store) as store:
        try:
            ruler: Ruler | None = None
            if settings.judge:
                ruler, judges = build_ruler(
                    judging_as_it_goes(settings, settings.store), rubric, store
                )
                for judge in judges:
                    await judge.check()  # a judge that cannot answer stops the run before it swaps
            async with contextlib.AsyncExitStack() as stack:
                swapper = None
                promoter = None
                if settings.swap:
                    swapper = await stack.enter_async_context(
                        AdapterSwapper(
                            upstreams=settings.upstream,
                            upstream_api_key=settings.upstream_api_key,
                            proxy=settings.proxy,
                            admin_key=settings.admin_key,
                            alias=settings.alias,
                            keep=settings.keep_adapters,
                        )
                    )
                    served_as = await swapper.check_base_model(policy.names)
                    swapper.alias = summary.alias = settings.alias or served_as
                    if settings.promote_alias is not None:
                        if settings.promote_alias == swapper.alias:
                            raise ConfigError(
                                f"--promote-alias {settings.promote_alias} is the training alias, "
                                "which moves every step: pass another --alias"
                            )
                        promoter = Promoter(
                            settings.promote_alias,
                            store,
                            swapper,
                            min_trajectories=settings.rollback_min_trajectories,
                            margin=settings.rollback_margin,
                            canary=CanaryPolicy(
                                settings.canary_shares,
                                settings.canary_alpha,
                                settings.canary_min_effect,
                                settings.canary_stage_trajectories,
                                settings.canary_gate_samples,
                                settings.canary_max_trajectories,
                            )
                            if settings.canary_shares
                            else None,
                            upstream=settings.upstream[0],
                            upstream_api_key=settings.upstream_api_key,
                        )
                teacher = None
                if settings.distils:
                    # Without --teacher: the base model as the upstream serves it, shown the
                    # context (self-distillation).
                    base = swapper.base_name if swapper is not None else None
                    teacher = await stack.enter_async_context(
                        Teacher(
                            settings.teacher_url,
                            settings.teacher or base or policy.served_name,
                            settings.teacher_api_key,
                            context=teacher_context(settings.teacher_context),
                        )
                    )
                    await teacher.check(settings.upstream[0], policy.served_name)
                sleeper = None
                if settings.sleep_upstreams:
                    sleeper = await stack.enter_async_context(
                        UpstreamSleep(settings.upstream, settings.upstream_api_key)
                    )
                    await sleeper.check()
                sink = stack.enter_context(MetricsSink(out, settings))
                trainer = Trainer(
                    settings,
                    store,
                    policy,
                    Checkpoints(out),
                    sink,
                    swapper,
                    promoter=promoter,
                    sleeper=sleeper,
                    teacher=teacher,
                    scenario_contexts=scenario_contexts(scenarios, settings.teacher_context_from),
                    on_warning=lambda text: console.print(f"[bold red]warning:[/] {escape(text)}"),
                )
                resumed = await trainer.resume()
                if resumed:
                    console.print(f"resumed {settings.run_name!r} after step {resumed} from {out}")
                    if swapper is not None and trainer.state.loaded_adapters:
                        # The alias may have served another model meanwhile: said, not done quietly.
                        console.print(
                            f"alias {swapper.alias!r} serves this run's newest adapter again: "
                            f"{trainer.state.loaded_adapters[-1]}",
                            highlight=False,
                        )
                warm_start = None
                if settings.sft is not None:
                    with console.status("rendering the demonstrations"):
                        warm_start = await load_warm_start(settings, store, policy, trainer.alias)
                    console.print(
                        f"warm start: {len(warm_start.demonstrations)} demonstrations, "
                        f"{warm_start.steps} steps ({settings.sft_epochs} "
                        f"epoch{'s' if settings.sft_epochs != 1 else ''})"
                    )
                    for skipped in warm_start.skipped:
                        console.print(f"[bold red]warning:[/] left out {escape(skipped)}")
                if promoter is not None:
                    await promoter.start()
                summary.trainer = trainer
                with _Display(console, settings) as display:
                    events = Events(display.status, display.step, display.rollouts, display.warning)
                    if agent is not None:
                        loop = WholeLoop(
                            trainer, settings, agent, scenarios, ruler, events, warm_start
                        )
                        summary.stopped = await _until_interrupted(loop.run())
                    else:
                        summary.stopped = await _until_interrupted(
                            run_sidecar(trainer, settings, events, warm_start)
                        )
        finally:
            for judge in judges:
                await judge.aclose()
    return summary


async def _until_interrupted(work: Coroutine[Any, Any, str]) -> str:
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        reason: str = await task
        return reason
    except asyncio.CancelledError:
        return "interrupted (the next start resumes from the last checkpoint)"
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


class _Display:
    """One line per step above a live status line and a rollout bar."""

    def __init__(self, console: Console, settings: TrainSettings) -> None:
        self._console = console
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=settings.steps or None)
        self._said = ""  # the last status
        self._lines = ProgressLines(console)
        self._columns = (*_COLUMNS, _TEACHER_COLUMN) if settings.distils else _COLUMNS

    def __enter__(self) -> _Display:
        self._progress.start()
        header = " ".join(f"{title:>7}" for title, _, _ in self._columns) + "  swap"
        # Lines as they are, never wrapped at a pipe's 80 columns (where `up` relays them).
        self._console.print(f"[bold]{header}[/]", soft_wrap=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._progress.stop()

    def status(self, text: str) -> None:
        self._progress.update(self._task, description=text, total=None, completed=0)
        self._lines.say(text)  # no live line to read: each status printed once
        self._said = text

    def rollouts(self, done: int, total: int) -> None:
        self._progress.update(self._task, total=total, completed=done)
        self._lines.count(self._said or "rollouts", done, total)

    def warning(self, text: str) -> None:
        self._console.print(f"[bold red]warning:[/] {escape(text)}", soft_wrap=True)

    def step(self, record: TrainingStep) -> None:
        self._console.print(step_line(record, self._columns), highlight=False, soft_wrap=True)


def step_line(record: TrainingStep, columns: tuple[tuple[str, str, str], ...] = _COLUMNS) -> str:
    values = {**record.metrics, "step": float(record.step)}
    if "val_reward" not in values and "val_reward_base" in values:
        # `val` is of the weights a step started from: step 1's, the base model's.
        values["val_reward"] = values["val_reward_base"]
    cells = [f"{fmt.format(values[key]) if key in values else '-':>7}" for _, key, fmt in columns]
    swap: str = record.swap or "-"
    if record.status == "abandoned":
        swap = f"abandoned: {record.reason}"
    elif record.swap_error:
        swap = f"{swap}: {record.swap_error}"
    if record.promotion:
        swap += f"; {record.promotion}"
    if record.kind == "sft":
        swap += "; warm start"
    return " ".join(cells) + f"  {swap}"


def _best_row(state: TrainerState) -> str:
    """The best validated weights: the step they came after, and the step line that shows
    their validation."""
    if state.best_step is None or state.best_val is None:
        return "-"
    if state.best_step == 0:
        return f"the base model (val {state.best_val:.2f}, on step 1's line)"
    return (
        f"the adapter of step {state.best_step} (val {state.best_val:.2f}, on step "
        f"{state.best_step + 1}'s line)"
    )


def _reward_row(rewards: list[tuple[int, float]]) -> str:
    """The training reward by step, short enough for one line of the summary: every step's
    when there are few, else the first, the last few and the best (metrics.jsonl has all)."""
    if not rewards:
        return "-"
    if len(rewards) <= _REWARDS_SHOWN:
        return " -> ".join(f"{r:.2f}@{s}" for s, r in rewards)
    shown = [rewards[0], *rewards[-(_REWARDS_SHOWN - 2) :]]
    best_step, best = max(rewards, key=lambda sr: sr[1])
    curve = f"{shown[0][1]:.2f}@{shown[0][0]} -> ... -> "
    curve += " -> ".join(f"{r:.2f}@{s}" for s, r in shown[1:])
    return f"{curve} (best {best:.2f}@{best_step})"


class TrainSummary:
    def __init__(self, settings: TrainSettings, alias: str) -> None:
        self.settings = settings
        self.alias = alias
        self.trainer: Trainer | None = None
        self.stopped = "not started"
        self.started = time.monotonic()

    def table(self) -> Table:
        settings = self.settings
        title = f"art-proxy train: run {settings.run_name!r}, alias {self.alias!r}"
        table = Table(title=title, title_justify="left", show_header=False, min_width=len(title))
        table.add_column(justify="right")
        table.add_column()
        rows = [("stopped", self.stopped)]
        if self.trainer is not None:
            state = self.trainer.state
            rewards = state.reward_history
            applied = len([s for s in state.applied_steps if s > state.sft_steps])
            taken = state.step - state.sft_steps
            steps = str(state.step)
            if applied != taken:  # an abandoned step is a step, and changed nothing
                steps += f" ({applied} applied, {taken - applied} abandoned)"
            rows += [
                ("steps", steps),
                ("reward", _reward_row(rewards)),
                # As the step lines show it: a step's `val` is of the weights it started from
                # (step 1's, the base model's), so the weights after step N show on step N+1.
                ("validation", ", ".join(f"{v:.2f}@{s + 1}" for s, v in state.val_history) or "-"),
                ("best", _best_row(state)),
                ("serving", state.loaded_adapters[-1] if state.loaded_adapters else "base model"),
            ]
            rows += [("warning", warning) for warning in self.trainer.stopping.warnings[-3:]]
        rows += [
            ("wall time", f"{time.monotonic() - self.started:.0f} s"),
            ("metrics", str(Path(settings.out) / "metrics.jsonl")),
        ]
        for label, value in rows:
            table.add_row(label, escape(value))
        return table
