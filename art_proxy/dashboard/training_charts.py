"""The training page's charts, drawn from the run's step records: reward, loss, the agent's own
metrics, KL, a teacher's KL, off-policy correction, staleness, the pipeline's wait and lead, and
the time a step took."""

from __future__ import annotations

from collections.abc import Sequence

from art_proxy.records import AGENT_METRIC_PREFIX, TrainingStep

from .plots import Chart, Series, line_chart


def training_charts(steps: Sequence[TrainingStep]) -> list[tuple[str, Chart | None]]:
    """Each chart under its anchor name, in page order (None: the run recorded no data for it)."""
    return [
        ("reward", reward_chart(steps)),
        ("loss", _loss_chart(steps)),
        ("agent-metrics", _agent_chart(steps)),
        ("kl", _metric_chart(steps, "kl", "KL to the base model", "nats per token")),
        ("teacher", _teacher_chart(steps)),
        ("off-policy", _off_policy_chart(steps)),
        ("staleness", _staleness_chart(steps)),
        ("pipeline-wait", _pipeline_wait_chart(steps)),
        ("pipeline-ahead", _pipeline_ahead_chart(steps)),
        ("time", _time_chart(steps)),
    ]


def reward_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """Mean reward per step with its within-group spread as a band, and the validation reward
    from step 0 (the base model's, which the run's first step records) on."""
    trained = [step for step in steps if "reward_mean" in step.metrics]
    validation = _metric_series(steps, "val_reward", "validation reward")
    base = [
        (0, step.metrics["val_reward_base"]) for step in steps if "val_reward_base" in step.metrics
    ]
    series = [
        Series(
            "reward mean",
            [(step.step, step.metrics["reward_mean"]) for step in trained],
            [step.metrics.get("reward_std", 0.0) for step in trained],
        ),
        Series(validation.name, [*base[:1], *validation.points]),
    ]
    # Rewards all in [0, 1] (RULER's, most agents'): the band stays in it.
    values = [value for one in series for _, value in one.points]
    unit = bool(values) and all(0.0 <= value <= 1.0 for value in values)
    return line_chart(
        "Reward",
        series,
        floor=0.0 if unit else None,
        ceiling=1.0 if unit else None,
        y_title="reward",
    )


def _loss_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """GRPO's loss, and a warm start's (the demonstrations' negative log-likelihood per token:
    another quantity, so a series of its own)."""
    warm = [step for step in steps if step.kind == "sft"]
    grpo = [step for step in steps if step.kind == "grpo"]
    return line_chart(
        "Loss",
        [
            _metric_series(grpo, "loss", "GRPO loss"),
            _metric_series(warm, "loss", "warm start: demonstrations' NLL per token"),
        ],
        y_title="loss",
    )


def _teacher_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """On-policy distillation (--teacher): how far the sampled tokens are from what the teacher
    would write (the mean of log mu - log p_teacher over them, the reverse KL's estimate); it
    falls as the student learns the teacher's way. Absent without a teacher."""
    return line_chart(
        "Teacher: reverse KL of the sampled tokens from the teacher (per token)",
        [_metric_series(steps, "teacher_kl", "teacher KL")],
        y_title="nats per token",
    )


def _off_policy_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """How far the trained tokens were from the distribution they were scored with, and how much
    the objective had to correct: the sampler's numerics (bf16 serving) and stale adapters show
    here before they show in the reward."""
    return line_chart(
        "Off-policy: mismatch and correction",
        [
            _metric_series(steps, "mismatch", "mean |d logprob| sampler vs trainer"),
            _metric_series(steps, "is_capped", "tokens whose weight was capped"),
            _metric_series(steps, "clip_fraction", "tokens clipped (mean of the step's updates)"),
            _metric_series(steps, "clip_fraction_last", "tokens clipped in the step's last update"),
            _metric_series(steps, "update_drift_last", "|d logprob| the step's updates moved"),
        ],
        y_title="nats, or share of tokens",
    )


def _staleness_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    return line_chart(
        "Staleness: changes of the weights between the sampling adapter and the trained one "
        "(every group a step consumed)",
        [
            _metric_series(steps, "staleness_mean", "mean"),
            _metric_series(steps, "staleness_max", "max"),
        ],
        floor=0.0,
        y_title="weight changes",
    )


def _pipeline_wait_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """The overlapped loop (--max-off-policy-steps): who waited for whom. Absent for an
    alternating run (no step carries the metrics)."""
    return line_chart(
        "Pipeline: seconds waited",
        [
            _metric_series(steps, "pipeline_trainer_wait_s", "the trainer, for its batch"),
            _metric_series(steps, "pipeline_admission_wait_s", "the rollouts, for admission"),
        ],
        floor=0.0,
        y_title="seconds",
    )


def _pipeline_ahead_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    return line_chart(
        "Pipeline: how far the rollouts ran ahead",
        [
            _metric_series(steps, "pipeline_steps_ahead", "steps still to take when they began"),
            _metric_series(steps, "pipeline_queue_depth", "batches ready when one was taken"),
        ],
        floor=0.0,
        y_title="steps, or batches",
    )


# The phases of a step the trainer times (seconds_<phase>), in the order they run.
_PHASES = ("prepare", "teacher", "train", "checkpoint", "swap")


def _time_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """Seconds per step, whole and by phase: where a slow run's time goes."""
    return line_chart(
        "Time per step",
        [
            _metric_series(steps, "seconds_step", "the whole step"),
            *(_metric_series(steps, f"seconds_{phase}", phase) for phase in _PHASES),
        ],
        floor=0.0,
        y_title="seconds",
    )


def _agent_chart(steps: Sequence[TrainingStep]) -> Chart | None:
    """What the agent reported of its training rollouts (tool calls, turns...), a mean per step."""
    names = sorted({m for step in steps for m in step.metrics if m.startswith(AGENT_METRIC_PREFIX)})
    series = [_metric_series(steps, name, name.removeprefix(AGENT_METRIC_PREFIX)) for name in names]
    return line_chart("Agent metrics (mean per training rollout)", series, y_title="mean")


def _metric_chart(
    steps: Sequence[TrainingStep], metric: str, title: str, y_title: str = ""
) -> Chart | None:
    return line_chart(title, [_metric_series(steps, metric, metric)], y_title=y_title)


def _metric_series(steps: Sequence[TrainingStep], metric: str, name: str) -> Series:
    return Series(
        name, [(step.step, step.metrics[metric]) for step in steps if metric in step.metrics]
    )
