"""Where each step's metrics go: the store (by the trainer), `metrics.jsonl`, `metrics.prom`, and
the experiment trackers asked for (`--report-to tensorboard|wandb|mlflow`).

One JSON object per line, the step's record as stored (metrics, groups and their outcomes, swap),
appended and flushed per step, so a crash loses nothing already trained. `metrics.prom` is the
latest step in Prometheus' text format, replaced whole each step, for node_exporter's textfile
collector (or any scraper of files), and served on `--metrics-port` when given: the step, the time of the last step and of the last swap,
steps and swaps counted, and every metric of the step under a name of its own with its unit
(`art_proxy_trainer_step_reward_mean`, `..._step_train_seconds`, `..._step_judge_cost_usd`), all
labelled with the run.
A tracker (`art_proxy.trackers`) gets each step's metrics under their own names, at the step's
number.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

from art_proxy.config import TrainSettings
from art_proxy.errors import ConfigError
from art_proxy.records import TrainingStep
from art_proxy.trackers import Tracker, open_trackers

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import Gauge


class MetricsSink:
    def __init__(self, out: Path, settings: TrainSettings | None = None) -> None:
        self.path = out / "metrics.jsonl"
        self.prometheus_path = out / "metrics.prom"
        self._prometheus = _PrometheusFile(self.prometheus_path)
        self._out = out
        self._settings = settings
        self._file: IO[str] | None = None
        self._trackers: list[Tracker] = []
        self._server: WSGIServer | None = None

    def __enter__(self) -> MetricsSink:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if self._settings is not None:
            try:
                settings = self._settings
                if settings.metrics_port is not None:
                    self._server = self._prometheus.serve(settings.metrics_port)
                self._trackers = open_trackers(
                    settings,
                    settings.run_name,
                    tensorboard=settings.tensorboard or str(self._out / "tensorboard"),
                    wandb_dir=self._out,
                )
            except BaseException:
                self._file.close()
                self._stop_serving()
                raise
        return self

    def _stop_serving(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
        self._stop_serving()
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
        self._step = Gauge(
            prefix + "step", "The last step's number.", ["run"], registry=self._registry
        )
        self._steps = Counter(
            prefix + "steps", "Steps taken by this process, by status.", ["run", "status"],
            registry=self._registry,
        )  # fmt: skip
        self._swaps = Counter(
            prefix + "swaps", "Adapter swaps by what the upstream answered.", ["run", "swap"],
            registry=self._registry,
        )  # fmt: skip
        self._last_step = Gauge(
            prefix + "last_step_timestamp_seconds", "When the last step was recorded.", ["run"],
            registry=self._registry,
        )  # fmt: skip
        self._last_swap = Gauge(
            prefix + "last_swap_timestamp_seconds", "When an adapter was last swapped in.",
            ["run"], registry=self._registry,
        )  # fmt: skip
        self._metrics: dict[str, Gauge] = {}  # a step metric's name -> its gauge

    def serve(self, port: int) -> WSGIServer:
        """Serve the same figures on `port`, every interface, from a thread of their own (a
        scraper is answered while a step holds the event loop)."""
        from prometheus_client import start_http_server

        try:
            server, _thread = start_http_server(port, registry=self._registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: {exc.strerror or exc}") from exc
        return server

    def log(self, record: TrainingStep) -> None:
        from prometheus_client import write_to_textfile

        now = time.time()
        run = record.run
        self._step.labels(run).set(record.step)
        self._steps.labels(run, record.status).inc()
        self._last_step.labels(run).set(now)
        if record.swap is not None:
            self._swaps.labels(run, record.swap).inc()
            if record.swap == "swapped":
                self._last_swap.labels(run).set(now)
        for name, value in record.metrics.items():
            self._gauge(name).labels(run).set(value)
        write_to_textfile(str(self._path), self._registry)

    def _gauge(self, metric: str) -> Gauge:
        from prometheus_client import Gauge  # at run time, as in __init__

        gauge = self._metrics.get(metric)
        if gauge is None:
            gauge = Gauge(
                "art_proxy_trainer_step_" + prometheus_name(metric),
                f"The last step's {metric}.",
                ["run"],
                registry=self._registry,
            )
            self._metrics[metric] = gauge
        return gauge


def prometheus_name(metric: str) -> str:
    """A step metric's name as Prometheus names a quantity: its unit last (`seconds_train` ->
    `train_seconds`), and only letters, digits and underscores (`agent/tool_calls` ->
    `agent_tool_calls`)."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", metric)
    if name.startswith("seconds_"):
        name = name.removeprefix("seconds_") + "_seconds"
    return name
