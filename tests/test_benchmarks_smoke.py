"""The benchmarks still run end to end, at smoke-test sizes: those that load the bundled model, and
the proxy's overhead against the fake upstream.

Their figures come from running them in full (see benchmarks/README.md), never from the tests.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


def test_proxy_overhead_benchmark_prints_the_key_figure_last() -> None:
    # A process of its own, as `make bench` runs it: it starts the fake and the proxy as its own
    # subprocesses and stops them on exit.
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "proxy_overhead.py"
    done = subprocess.run(
        [sys.executable, str(script), "--requests", "4", "--streams", "2", "--skip-litellm"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert any("art-proxy's process:" in line and "us of CPU a call" in line for line in lines)
    assert lines[-1].startswith("art-proxy: ") and "LiteLLM skipped" in lines[-1]


@pytest.mark.usefixtures("torch_threads")
def test_gpu_check_runs_its_tiny_form_on_a_cpu_and_prints_its_verdict_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.gpu_check import main as gpu_check

    assert gpu_check(["--tiny"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpu_check on CPU:") and last.endswith("PASS")


@pytest.mark.usefixtures("torch_threads")
def test_the_loop_check_runs_its_tiny_form_on_a_cpu_and_prints_its_verdict_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # local-llm sampling in bf16 and the proxy as processes, the trainer here: five steps, each
    # adapter swapped in, the reward of a model with random weights rising.
    from benchmarks.loop_check import main as loop_check

    assert loop_check(["--tiny", "--threads", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("loop check on CPU: 5/5 steps applied, 0 calls failed")
    assert last.endswith("PASS")


@pytest.mark.usefixtures("torch_threads")
def test_off_policy_benchmark_prints_the_stale_gap_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.off_policy import main as off_policy

    off_policy(["--quick"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("stale data, best objective ")


@pytest.mark.usefixtures("torch_threads")
def test_best_of_benchmark_prints_the_gain_and_cost_last(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.best_of import main as best_of

    best_of(["--quick"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("best-of-2 against as asked: reward ")
    assert "latency x" in last and "tokens x" in last


def test_trainer_memory_benchmark_prints_the_peak_ratio_last() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/trainer_memory.py", "--quick"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=600,
    )
    assert done.stdout.strip().splitlines()[-1].startswith("peak RSS of the default step: ")


def test_store_reads_benchmark_prints_the_steady_figures_last(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "store_reads.py"
    done = subprocess.run(
        [sys.executable, str(script), "--sizes", "400,2000", "--store-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("at 2,000 trajectories, steady: judge round, nothing new ")
    assert "(target < 50 ms: " in last
