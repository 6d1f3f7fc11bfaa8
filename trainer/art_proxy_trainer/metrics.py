"""Where each step's metrics go: the store (by the trainer), `metrics.jsonl`, `metrics.prom`, and
the experiment trackers asked for (`--report-to tensorboard|wandb|mlflow`).

One JSON object per line, the step's record as stored (metrics, groups and their outcomes, swap),
appended and flushed per step, so a crash loses nothing already trained. `metrics.prom` is the
latest step in Prometheus' text format, replaced whole each step, for node_exporter's textfile
collector (or any scraper of files): the step, the time of the last step and of the last swap,
steps and swaps counted, and every metric of the step as `art_proxy_trainer_metric{name=...}`. A tracker gets each
step's metrics under their own names, at the step's number, and the run's settings once (keys
left out, URLs without their credentials). Each is configured as its users expect, by its own
environment: W&B by `WANDB_PROJECT` (default art-proxy), `WANDB_MODE=offline`...; MLflow by
`MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` (default art-proxy).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol

from art_proxy.config import TrainSettings
from art_proxy.records import TrainingStep
from art_proxy.redaction import redact_url, scrub
from art_proxy_trainer.errors import TrainerError

PROJECT = "art-proxy"  # the W&B project and MLflow experiment when the environment names none


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class MetricsSink:
    def __init__(self, out: Path, settings: TrainSettings | None = None) -> None:
        self.path = out / "metrics.jsonl"
        self.prometheus_path = out / "metrics.prom"
        self._prometheus = _PrometheusFile(self.prometheus_path)
        self._out = out
        self._settings = settings
        self._file: IO[str] | None = None
        self._trackers: list[Tracker] = []

    def __enter__(self) -> MetricsSink:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if self._settings is not None:
            try:
                self._trackers = open_trackers(self._settings, self._out)
            except BaseException:
                self._file.close()
                raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
        for tracker in self._trackers:
            tracker.close()

    def last_step(self) -> int:
        """The step of the file's last line (0: none), to replay one a kill kept from it."""
        if not self.path.is_file():
            return 0
        lines = self.path.read_text().splitlines()
        for line in reversed(lines):
            try:
                return TrainingStep.model_validate_json(line).step
            except ValueError:
                continue  # a line cut short by the kill
        return 0

    def write(self, record: TrainingStep) -> None:
        assert self._file is not None, "use `with MetricsSink(...)`"
        self._file.write(record.model_dump_json() + "\n")
        self._file.flush()
        self._prometheus.log(record)
        for tracker in self._trackers:
            tracker.log(record.metrics, record.step)


class _PrometheusFile:
    """The latest step for a Prometheus scraper of files, rewritten whole (write, then rename)."""

    def __init__(self, path: Path) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self._path = path
        self._registry = CollectorRegistry(auto_describe=False)
        prefix = "art_proxy_trainer_"
        self._step = Gauge(prefix + "step", "The last step's number.", registry=self._registry)
        self._steps = Counter(
            prefix + "steps", "Steps taken by this process, by status.", ["status"],
            registry=self._registry,
        )  # fmt: skip
        self._swaps = Counter(
            prefix + "swaps", "Adapter swaps by what the upstream answered.", ["swap"],
            registry=self._registry,
        )  # fmt: skip
        self._last_step = Gauge(
            prefix + "last_step_timestamp_seconds", "When the last step was recorded.",
            registry=self._registry,
        )  # fmt: skip
        self._last_swap = Gauge(
            prefix + "last_swap_timestamp_seconds", "When an adapter was last swapped in.",
            registry=self._registry,
        )  # fmt: skip
        self._metric = Gauge(
            prefix + "metric", "The last step's metrics (reward_mean, loss, clip_fraction...).",
            ["name"], registry=self._registry,
        )  # fmt: skip

    def log(self, record: TrainingStep) -> None:
        from prometheus_client import write_to_textfile

        now = time.time()
        self._step.set(record.step)
        self._steps.labels(record.status).inc()
        self._last_step.set(now)
        if record.swap is not None:
            self._swaps.labels(record.swap).inc()
            if record.swap == "swapped":
                self._last_swap.set(now)
        for name, value in record.metrics.items():
            self._metric.labels(name).set(value)
        write_to_textfile(str(self._path), self._registry)


def open_trackers(settings: TrainSettings, out: Path) -> list[Tracker]:
    """The trackers `settings` asks for, started; TrainerError naming the package one lacks."""
    wanted = list(settings.report_to)
    if settings.tensorboard and "tensorboard" not in wanted:
        wanted.append("tensorboard")
    trackers: list[Tracker] = []
    try:
        for name in wanted:
            if name == "tensorboard":
                trackers.append(_TensorBoard(settings.tensorboard or str(out / "tensorboard")))
            elif name == "wandb":
                trackers.append(_WandB(settings.run_name, out, tracked_settings(settings)))
            else:
                trackers.append(_MLflow(settings.run_name, tracked_settings(settings)))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers


def tracked_settings(settings: TrainSettings) -> dict[str, Any]:
    """The run's settings as a tracker shows them: no key, no credential in a URL."""
    keys = {name for name in type(settings).model_fields if name.endswith("_key")}
    shown = settings.model_dump(mode="json", exclude=keys)
    for name in ("store", "proxy"):
        if isinstance(shown.get(name), str):
            shown[name] = redact_url(shown[name])
    shown["upstream"] = [redact_url(url) for url in shown.get("upstream") or []]
    return scrub(shown)


def _needs(package: str, tracker: str) -> TrainerError:
    return TrainerError(
        f"--report-to {tracker} needs the {package} package (pip install {package})"
    )


class _TensorBoard:
    def __init__(self, directory: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _needs("tensorboard", "tensorboard") from exc
        self._writer = SummaryWriter(directory)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandB:
    def __init__(self, run_name: str, out: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise _needs("wandb", "wandb") from exc
        # Its banner and console capture are not for the trainer's screen.
        os.environ.setdefault("WANDB_SILENT", "true")
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=run_name,
            dir=str(out),
            config=config,
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _MLflow:
    def __init__(self, run_name: str, config: dict[str, Any]) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise _needs("mlflow-skinny", "mlflow") from exc
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines on the screen
        self._client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self._client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(name)
        )
        self._run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        # MLflow keeps parameters as strings of at most 6,000 characters.
        params = [Param(key, str(value)[:6000]) for key, value in sorted(config.items())]
        self._client.log_batch(self._run_id, params=params)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for name, value in metrics.items()]
        self._client.log_batch(self._run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)
