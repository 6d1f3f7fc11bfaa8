"""Where each step's metrics go: the store (by the trainer), `metrics.jsonl`, TensorBoard if asked.

One JSON object per line, the step's record as stored (metrics, groups and their outcomes, swap),
appended and flushed per step, so a crash loses nothing already trained.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import IO, Any

from art_proxy.records import TrainingStep
from art_proxy_trainer.errors import TrainerError


class MetricsSink:
    def __init__(self, out: Path, tensorboard: str | None = None) -> None:
        self.path = out / "metrics.jsonl"
        self._tensorboard_dir = tensorboard
        self._file: IO[str] | None = None
        self._writer: Any = None

    def __enter__(self) -> MetricsSink:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if self._tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise TrainerError(
                    "--tensorboard needs the tensorboard package (pip install tensorboard)"
                ) from exc
            self._writer = SummaryWriter(self._tensorboard_dir)
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
        if self._writer is not None:
            self._writer.close()

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
        if self._writer is not None:
            for name, value in record.metrics.items():
                self._writer.add_scalar(name, value, record.step)
            self._writer.flush()
