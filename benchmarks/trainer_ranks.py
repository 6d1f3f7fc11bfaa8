"""What N ranks cost and save against one process (`benchmarks/trainer_step.py --nproc N`).

Step time: trainer_step.py's batch (SmolLM2-135M + LoRA, a sampled GRPO group), one optimiser step
by one process with N torch threads (the same cores) and by N ranks of one thread each, DDP and
FSDP2, each the median of `--repeats` rounds after a warm-up round. A rank's round runs from a
barrier to the end of its step, collectives included; rank 0's figure is reported.

Memory: a larger random Llama (8 layers, width 1024, ~170M parameters), DDP against FSDP2: after
one step, the bytes each rank holds in weights and AdamW state (its shards, for FSDP2), and each
rank's peak resident memory. The trainer loads the whole base on each rank before sharding it, so
the peak includes one whole copy on the host; the steady state is what a device holds.

    .venv/bin/python benchmarks/trainer_step.py --nproc 2 [--repeats 5] [--quick]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table
from transformers import LlamaConfig, LlamaForCausalLM

from art_proxy.config import TrainerConfig
from art_proxy_trainer.batch import SequenceStats, TrainingBatch
from art_proxy_trainer.distributed import Ranks, Replica, Sharding, exit_rank, join, leave
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.policy import Policy
from art_proxy_trainer.step import train_step

REPO = Path(__file__).resolve().parents[1]
SHARDINGS: tuple[Sharding, ...] = ("ddp", "fsdp")
# The memory model: wide and deep enough that the weights dwarf torch's own footprint.
MEMORY_LAYERS, MEMORY_WIDTH, MEMORY_VOCABULARY = 8, 1024, 32_000
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def _ranks(nproc: int, *args: str) -> dict[str, float]:
    """Run this module's rank side under torchrun; rank 0's figures."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rank0.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", str(nproc), "-m", "benchmarks.trainer_ranks"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([*command, *args, str(out)], cwd=REPO, env=env, check=True)
        figures: dict[str, float] = json.loads(out.read_text())
        return figures


def _timed_steps(step: object, repeats: int, barrier: bool) -> list[float]:
    assert callable(step)
    step()  # warm-up: AdamW's state, allocator
    seconds = []
    for _ in range(repeats):
        if barrier:
            dist.barrier()
        started = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - started)
    return seconds


def _held_bytes(policy: Policy) -> float:
    """Weights and optimiser state this rank holds (its shards of sharded tensors)."""

    def local(tensor: torch.Tensor) -> int:
        to_local = getattr(tensor, "to_local", None)
        held = to_local() if to_local is not None else tensor
        return int(held.numel() * held.element_size())

    weights = sum(local(p) for p in policy.model.parameters())
    state = sum(
        local(value)
        for values in policy.optimizer.state.values()
        for value in values.values()
        if isinstance(value, torch.Tensor)
    )
    return float(weights + state)


def _memory_batch(rows: int = 4, length: int = 128) -> TrainingBatch:
    generator = torch.Generator().manual_seed(0)
    tokens_B_T = torch.randint(1, MEMORY_VOCABULARY, (rows, length), generator=generator)
    mask_B_T = torch.zeros(rows, length)
    mask_B_T[:, length // 2 :] = 1.0
    return TrainingBatch(
        tokens_B_T,
        torch.ones(rows, length, dtype=torch.int64),
        mask_B_T,
        -torch.rand(rows, length, generator=generator) * mask_B_T,
        torch.tensor([1.0, -1.0, 0.5, -0.5])[:rows],
        SequenceStats(sequences=rows),
    )


def rank_main(mode: str, sharding: Sharding, repeats: int, batch_file: str, out: str) -> None:
    """One rank: time steps on the saved batch (`time`), or take one step of the large model
    and measure what it holds (`memory`)."""
    ranks = Ranks.of_environment()
    assert ranks is not None, "run under torchrun"
    cpu = torch.device("cpu")
    join(ranks, 600, cpu)
    torch.set_num_threads(1)
    config = TrainerConfig()
    replica = None
    try:
        torch.manual_seed(0)
        if mode == "time":
            batch = torch.load(batch_file, weights_only=False)
            from art_proxy.local.model_loading import load_model

            model = lora_model(load_model(None).model, config)
        else:
            batch = _memory_batch()
            model = lora_model(
                LlamaForCausalLM(
                    LlamaConfig(
                        hidden_size=MEMORY_WIDTH,
                        intermediate_size=4 * MEMORY_WIDTH,
                        num_hidden_layers=MEMORY_LAYERS,
                        num_attention_heads=16,
                        num_key_value_heads=4,
                        vocab_size=MEMORY_VOCABULARY,
                    )
                ),
                config,
            )
        policy = Policy(model, make_optimizer(model, config), 0, "bench", {"bench"})
        replica = Replica(policy, ranks, sharding, config, cpu)
        figures: dict[str, float] = {}
        if mode == "time":
            step = lambda: replica.train(batch, config)  # noqa: E731  # timed as is
            figures["median_s"] = statistics.median(_timed_steps(step, repeats, barrier=True))
        else:
            replica.train(batch, config)
            held = torch.tensor([_held_bytes(policy)], dtype=torch.float64)
            peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0])
            dist.all_reduce(held, op=dist.ReduceOp.MAX)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            figures = {"held_bytes": float(held), "peak_rss_bytes": float(peak)}
        if ranks.leads:
            Path(out).write_text(json.dumps(figures))
    finally:
        if replica is not None:
            replica.close()
        leave()


def run(nproc: int, repeats: int, batch: TrainingBatch) -> None:
    """The comparison, printed with its key figure last."""
    from art_proxy.local.model_loading import load_model

    console.print(f"one process, {nproc} torch threads ...")
    torch.set_num_threads(nproc)
    torch.manual_seed(0)
    config = TrainerConfig()
    model = lora_model(load_model(None).model, config)
    optimizer = make_optimizer(model, config)
    single = statistics.median(
        _timed_steps(lambda: train_step(model, optimizer, batch, config), repeats, barrier=False)
    )
    times: dict[str, float] = {}
    memory: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        batch_file = Path(scratch) / "batch.pt"
        torch.save(batch, batch_file)
        for sharding in SHARDINGS:
            console.print(f"{nproc} ranks, {sharding}: step time ...")
            times[sharding] = _ranks(nproc, "time", sharding, str(repeats), str(batch_file))[
                "median_s"
            ]
            console.print(f"{nproc} ranks, {sharding}: memory of the 8x1024 model ...")
            memory[sharding] = _ranks(nproc, "memory", sharding, "1", str(batch_file))

    table = Table(title=f"one GRPO step on {nproc} ranks (gloo, one thread each) vs one process")
    for column in ("what runs", "median ms", "vs one process"):
        table.add_column(column, justify="right")
    table.add_row(f"one process, {nproc} threads", f"{single * 1000:.0f}", "1.00x")
    for arm, seconds in times.items():
        table.add_row(f"{nproc} ranks, {arm}", f"{seconds * 1000:.0f}", f"{seconds / single:.2f}x")
    console.print(table)
    mib = 1024 * 1024
    held = Table(title=f"per rank, 8 layers x {MEMORY_WIDTH} Llama + LoRA, after one step")
    for column in ("sharding", "weights + AdamW state MiB", "peak RSS MiB"):
        held.add_column(column, justify="right")
    for arm, figures in memory.items():
        held.add_row(
            arm,
            f"{figures['held_bytes'] / mib:.0f}",
            f"{figures['peak_rss_bytes'] / mib:.0f}",
        )
    console.print(held)
    saving = memory["fsdp"]["held_bytes"] / memory["ddp"]["held_bytes"]
    console.print(  # the key figure, last
        f"{nproc} ranks: DDP step {times['ddp'] / single:.2f}x and FSDP2 step "
        f"{times['fsdp'] / single:.2f}x one process; FSDP2 holds {saving:.2f}x DDP's bytes per rank"
    )


if __name__ == "__main__":
    # The rank side: MODE SHARDING REPEATS BATCH_FILE OUT.
    mode, kind, repeats, batch_file, out = sys.argv[1:6]
    rank_main(mode, "fsdp" if kind == "fsdp" else "ddp", int(repeats), batch_file, out)
    # Past the interpreter's finalization, as the trainer's ranks end: gloo's threads torn down
    # by it have aborted a finished FSDP rank ("terminate called without an active exception").
    exit_rank()
