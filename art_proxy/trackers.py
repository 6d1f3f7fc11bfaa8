"""Experiment trackers (`--report-to tensorboard,wandb,mlflow`): a command's figures, a step at a
time, where its users already look.

Each tracker is configured as its users expect, by its own environment: W&B by `WANDB_PROJECT`
(default art-proxy) and `WANDB_MODE=offline`...; MLflow by `MLFLOW_TRACKING_URI` and
`MLFLOW_EXPERIMENT_NAME` (default art-proxy). A run is named as the command's run is, and its
settings go with it once, keys left out and URLs without their credentials. The packages are
imported only when asked for (`pip install 'art-proxy[trackers]'`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from art_proxy.config.shared import ReportSettings
from art_proxy.errors import ConfigError
from art_proxy.privacy.redaction import redact_url, scrub

PROJECT = "art-proxy"  # the W&B project and MLflow experiment when the environment names none


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def open_trackers(
    settings: ReportSettings, run_name: str, *, tensorboard: str, wandb_dir: Path
) -> list[Tracker]:
    """The trackers `settings` asks for, started (`tensorboard`: its directory unless
    --tensorboard names one); ConfigError naming the package one lacks."""
    wanted = list(settings.report_to)
    if settings.tensorboard and "tensorboard" not in wanted:
        wanted.append("tensorboard")
    trackers: list[Tracker] = []
    try:
        for name in wanted:
            if name == "tensorboard":
                trackers.append(_TensorBoard(settings.tensorboard or tensorboard))
            elif name == "wandb":
                trackers.append(_WandB(run_name, wandb_dir, tracked_settings(settings)))
            else:
                trackers.append(_MLflow(run_name, tracked_settings(settings)))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers


def tracked_settings(settings: BaseModel) -> dict[str, Any]:
    """A command's settings as a tracker shows them: no key, no credential in a URL."""
    keys = {name for name in type(settings).model_fields if name.endswith("_key")}
    shown = settings.model_dump(mode="json", exclude=keys)
    for name, value in shown.items():
        if isinstance(value, str) and "://" in value:
            shown[name] = redact_url(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            shown[name] = [redact_url(v) if "://" in v else v for v in value]
    return scrub(shown)


def _needs(package: str, tracker: str) -> ConfigError:
    return ConfigError(f"--report-to {tracker} needs the {package} package (pip install {package})")


class _TensorBoard:
    def __init__(self, directory: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _needs("tensorboard", "tensorboard") from exc  # and torch
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
