"""The benchmarks that load the bundled model still run end to end, at smoke-test sizes.

Their figures come from running them in full (see benchmarks/README.md), never from the tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from benchmarks.trainer_step import main as trainer_step


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """The benchmark sets torch's thread count for the whole process: put it back after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("torch_threads")
def test_trainer_step_benchmark_prints_its_ratio_to_raw_peft_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One thread: two would crawl while other tests' processes keep the cores busy.
    trainer_step(["--quick", "--threads", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("train_step = ")
    assert "x raw peft forward+backward" in last


@pytest.mark.usefixtures("torch_threads")
def test_trainer_step_benchmark_on_two_ranks_prints_the_ranks_figures_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trainer_step(["--quick", "--threads", "1", "--nproc", "2"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("2 ranks: DDP step ") and "DDP's bytes per rank" in last
