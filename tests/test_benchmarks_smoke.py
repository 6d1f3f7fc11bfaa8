"""The benchmarks that load the bundled model still run end to end, at smoke-test sizes.

Their figures come from running them in full (see benchmarks/README.md), never from the tests.
"""

from __future__ import annotations

import pytest

from benchmarks.trainer_step import main as trainer_step


def test_trainer_step_benchmark_prints_its_ratio_to_raw_peft_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trainer_step(["--quick"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("train_step = ")
    assert "x raw peft forward+backward" in last
