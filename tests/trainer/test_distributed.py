"""The trainer on several ranks (torch.distributed, gloo on this CPU) learns what one process does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.batch import TrainingBatch
from art_proxy_trainer.distributed import shares
from art_proxy_trainer.step import train_step
from tests.trainer.agents import untagged
from tests.trainer.conftest import TINY_NAME, Stack
from tests.trainer.ranks_step import CONFIG, fixed_batch, lora_weights, policy
from tests.trainer.test_training_loop import finished_groups, train_command

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


SHARDINGS = ["ddp", "fsdp"]


@pytest.fixture(scope="module")
def ranks_steps(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Path]:
    """The folder where one torchrun launch of `nproc` ranks wrote each sharding's step of `rows`
    rows (tests/trainer/ranks_step.py), launched once per (nproc, rows) for the module."""
    launched: dict[tuple[int, int], Path] = {}

    def steps(nproc: int, rows: int) -> Path:
        if (nproc, rows) not in launched:
            out_dir = tmp_path_factory.mktemp(f"ranks-{nproc}-{rows}")
            run = _torchrun(
                nproc, "-m", "tests.trainer.ranks_step", str(out_dir), str(rows), *SHARDINGS
            )
            assert run.returncode == 0, run.stderr[-3000:]
            launched[nproc, rows] = out_dir
        return launched[nproc, rows]

    return steps


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize(
    ("nproc", "rows"),
    [(2, 5), (3, 2)],  # 3 ranks, 2 rows: one rank trains nothing and still keeps step
)
@pytest.mark.xdist_group("ranks_step")  # one launch serves both shardings: one worker
def test_a_step_on_several_ranks_equals_the_step_of_one_process(
    ranks_steps: Callable[[int, int], Path], nproc: int, rows: int, sharding: str
) -> None:
    single = policy()
    batch = fixed_batch(single.model).take(list(range(rows)))
    expected = train_step(single.model, single.optimizer, batch, CONFIG)
    got = torch.load(ranks_steps(nproc, rows) / f"{sharding}.pt", weights_only=True)
    assert expected.applied and got["applied"]
    assert got["loss"] == pytest.approx(expected.loss, rel=1e-5, abs=1e-7)
    assert got["grad_norm"] == pytest.approx(expected.grad_norm, rel=1e-5)
    weights = lora_weights(single.model)
    assert weights.keys() == got["weights"].keys()
    for name, value in weights.items():
        # Adam divides by the gradient's own scale: summation order shows at ~1e-6.
        torch.testing.assert_close(got["weights"][name], value, rtol=1e-4, atol=1e-5)


def _ranks(launcher: int) -> dict[int, int]:
    """Rank -> pid of the ranks a launcher process started (Linux /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{launcher}/task").iterdir():
        children += [int(pid) for pid in (task / "children").read_text().split()]
    ranks = {}
    for pid in children:
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            variables = dict(item.split(b"=", 1) for item in environ if b"=" in item)
            if b"RANK" in variables:
                ranks[int(variables[b"RANK"])] = pid
    return ranks


async def _consumed_once(stack: Stack, groups: set[str], steps: int) -> None:
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        recorded = await store.training_steps(run="run")
        aliases = await store.aliases()
    assert [s.step for s in recorded] == list(range(1, steps + 1))
    assert all(s.status == "applied" and s.swap == "swapped" for s in recorded)
    consumed = [group for step in recorded for group in step.groups]
    assert sorted(consumed) == sorted(groups)  # every group once: none lost, none repeated
    assert [(untagged(a.model), a.step) for a in aliases] == [(f"{TINY_NAME}@{steps}", steps)]


def _nproc_command(stack: Stack, out: Path, steps: int, sharding: str = "ddp") -> list[str]:
    ranks = ["--nproc", "2", "--threads", "1", "--sharding", sharding]
    return [*train_command(stack, out, steps), *ranks]


async def test_the_sidecar_on_two_ranks_trains_swaps_and_consumes_every_group_once(
    stack: Stack, tmp_path: Path
) -> None:
    groups = await finished_groups(stack, scenarios=3, rounds=1)  # step 1 takes 2 of 3
    out = tmp_path / "run"
    # Rank 0 waits for step 2's groups well beyond the collective timeout: its heartbeat keeps
    # the other rank from taking the silence for a dead rank 0. (The timeout bounds the ranks'
    # rendezvous too: at 2 s, two ranks importing torch on a busy 2-core machine missed it.)
    command = [*_nproc_command(stack, out, steps=3), "--collective-timeout", "5"]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    while not (out / "checkpoints" / "step-000001").exists():
        if process.returncode is not None:
            _, stderr = await process.communicate()
            pytest.fail(f"the run ended before its first step:\n{stderr.decode()[-3000:]}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(12)
    groups |= await finished_groups(stack, scenarios=3, rounds=1)  # 3 more: steps 2, 3
    stdout, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, stderr.decode()[-3000:]
    assert "reached --steps 3" in stdout.decode()
    await _consumed_once(stack, groups, steps=3)


async def test_a_killed_rank_stops_the_run_and_a_restart_loses_no_group(
    stack: Stack, tmp_path: Path
) -> None:
    groups = await finished_groups(stack, scenarios=3, rounds=2)
    out = tmp_path / "run"
    # Sharded: the checkpoints are gathered from both ranks' shards, and the restart hands the
    # checkpoint to both.
    command = _nproc_command(stack, out, steps=3, sharding="fsdp")
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    # Rank 1 dies once step 1 is checkpointed: in step 2, or while rank 0 looks for its groups.
    while not (out / "checkpoints" / "step-000001").exists():
        assert process.returncode is None, "the run ended before its first step"
        await asyncio.sleep(0.01)
    os.kill(_ranks(process.pid)[1], signal.SIGKILL)
    _, stderr = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 1
    assert "rank 1 of 2 failed (killed by SIGKILL)" in stderr.decode()
    assert "Traceback" not in stderr.decode()

    restarted = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(restarted.communicate(), 300)
    assert restarted.returncode == 0, stderr.decode()[-3000:]
    await _consumed_once(stack, groups, steps=3)
