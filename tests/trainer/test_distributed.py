"""The trainer on several ranks (torch.distributed, gloo on this CPU) learns what one process does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.distributed import shares
from art_proxy_trainer.step import train_step
from tests.trainer.ranks_step import CONFIG, fixed_batch, lora_weights, policy

REPO = Path(__file__).resolve().parents[2]


def _torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(nproc), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_ranks_share_a_batch_balanced_by_tokens() -> None:
    batch = fixed_batch(policy().model)
    assert shares(batch, 2) == [[0, 3, 4], [1, 2]]  # 12+6+4 tokens against 10+8
    assert sorted(row for share in shares(batch, 3) for row in share) == list(range(5))
    assert shares(batch, 8)[5:] == [[], [], []]  # more ranks than rows: some train nothing


def test_taking_rows_keeps_each_rows_tensors() -> None:
    batch = fixed_batch(policy().model)
    taken: TrainingBatch = batch.take([3, 1])
    assert torch.equal(taken.tokens_B_T, batch.tokens_B_T[[3, 1]])
    assert taken.trained_tokens == int(batch.mask_B_T[[3, 1]].sum())


@pytest.mark.parametrize(
    ("nproc", "rows"),
    [(2, 5), (3, 2)],  # 3 ranks, 2 rows: one rank trains nothing and still keeps step
)
def test_a_step_on_several_ranks_equals_the_step_of_one_process(
    tmp_path: Path, nproc: int, rows: int
) -> None:
    single = policy()
    batch = fixed_batch(single.model).take(list(range(rows)))
    expected = train_step(single.model, single.optimizer, batch, CONFIG)
    out = tmp_path / "rank0.pt"
    run = _torchrun(nproc, "-m", "tests.trainer.ranks_step", str(out), str(rows))
    assert run.returncode == 0, run.stderr[-3000:]
    got = torch.load(out, weights_only=True)
    assert expected.applied and got["applied"]
    assert got["loss"] == pytest.approx(expected.loss, rel=1e-5, abs=1e-7)
    assert got["grad_norm"] == pytest.approx(expected.grad_norm, rel=1e-5)
    weights = lora_weights(single.model)
    assert weights.keys() == got["weights"].keys()
    for name, value in weights.items():
        # Adam divides by the gradient's own scale: summation order shows at ~1e-6.
        torch.testing.assert_close(got["weights"][name], value, rtol=1e-4, atol=1e-5)
