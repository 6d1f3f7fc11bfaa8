"""What N ranks cost and save against one process (`benchmarks/trainer_step.py --nproc N`).

Step time: trainer_step.py's batch (SmolLM2-135M + LoRA, a sampled GRPO group), one optimiser step
by one process with N torch threads (the same cores) and by N ranks of one thread each, DDP and
FSDP2, each the median of `--repeats` rounds after a warm-up round. A rank's round runs from a
barrier to the end of its step, collectives included; rank 0's figure is reported.

Memory: a larger random Llama (8 layers, width 1024, ~170M parameters; 2 x 256 with `--quick`),
DDP against FSDP2: after one step, the bytes each rank holds in weights and AdamW state (its
shards, for FSDP2), and each rank's peak resident memory. The trainer loads the whole base on each
rank before sharding it, so the peak includes one whole copy on the host; the steady state is what
a device holds.

One torchrun launch per sharding measures both, memory first (a process's peak resident memory
only grows, so it is read before the step-time model is loaded): a rank's start (torch,
transformers and peft imported) costs more CPU here than its steps.

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
from dataclasses import astuple, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from peft import PeftModel
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


@dataclass(frozen=True)
class MemoryModel:
    """The random Llama whose per-rank memory is measured."""

    layers: int
    width: int
    vocabulary: int

    @property
    def name(self) -> str:
        return f"{self.layers} layers x {self.width} Llama"


# Wide and deep enough that the weights dwarf torch's own footprint.
MEMORY_MODEL = MemoryModel(layers=8, width=1024, vocabulary=32_000)
# `--quick`'s: every path taken, in a fraction of the full model's step.
QUICK_MEMORY_MODEL = MemoryModel(layers=2, width=256, vocabulary=4_096)
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def _ranks(nproc: int, *args: str) -> dict[str, float]:
    """Run this module's rank side under torchrun; rank 0's figures (step time and memory)."""
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


def _memory_batch(vocabulary: int, rows: int = 4, length: int = 128) -> TrainingBatch:
    generator = torch.Generator().manual_seed(0)
    tokens_B_T = torch.randint(1, vocabulary, (rows, length), generator=generator)
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


def rank_main(
    sharding: Sharding, repeats: int, batch_file: str, memory: MemoryModel, out: str
) -> None:
    """One rank: one step of the memory model and what it holds, then the saved batch's steps
    timed; rank 0 writes both."""
    ranks = Ranks.of_environment()
    assert ranks is not None, "run under torchrun"
    join(ranks, 600, torch.device("cpu"))
    torch.set_num_threads(1)
    try:
        figures = _memory_figures(ranks, sharding, memory)
        figures["median_s"] = _step_seconds(ranks, sharding, repeats, batch_file)
        if ranks.leads:
            Path(out).write_text(json.dumps(figures))
    finally:
        leave()


def _replica(ranks: Ranks, sharding: Sharding, model: PeftModel, config: TrainerConfig) -> Replica:
    policy = Policy(model, make_optimizer(model, config), 0, "bench", {"bench"})
    return Replica(policy, ranks, sharding, config, torch.device("cpu"))


def _memory_figures(ranks: Ranks, sharding: Sharding, memory: MemoryModel) -> dict[str, float]:
    config = TrainerConfig()
    torch.manual_seed(0)
    llama = LlamaConfig(
        hidden_size=memory.width,
        intermediate_size=4 * memory.width,
        num_hidden_layers=memory.layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=memory.vocabulary,
    )
    replica = _replica(ranks, sharding, lora_model(LlamaForCausalLM(llama), config), config)
    try:
        replica.train(_memory_batch(memory.vocabulary), config)
        held = torch.tensor([_held_bytes(replica.policy)], dtype=torch.float64)
        peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0])
        dist.all_reduce(held, op=dist.ReduceOp.MAX)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return {"held_bytes": float(held), "peak_rss_bytes": float(peak)}
    finally:
        replica.close()


def _step_seconds(ranks: Ranks, sharding: Sharding, repeats: int, batch_file: str) -> float:
    from art_proxy.local.model_loading import load_model

    config = TrainerConfig()
    torch.manual_seed(0)
    batch = torch.load(batch_file, weights_only=False)
    replica = _replica(ranks, sharding, lora_model(load_model(None).model, config), config)
    try:
        step = lambda: replica.train(batch, config)  # noqa: E731  # timed as is
        return statistics.median(_timed_steps(step, repeats, barrier=True))
    finally:
        replica.close()


def run(nproc: int, repeats: int, batch: TrainingBatch, memory: MemoryModel = MEMORY_MODEL) -> None:
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
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        batch_file = Path(scratch) / "batch.pt"
        torch.save(batch, batch_file)
        for sharding in SHARDINGS:
            console.print(f"{nproc} ranks, {sharding}: memory of the {memory.name}, step time ...")
            sizes = [str(size) for size in astuple(memory)]
            figures[sharding] = _ranks(nproc, sharding, str(repeats), str(batch_file), *sizes)
    times = {sharding: arm["median_s"] for sharding, arm in figures.items()}

    table = Table(title=f"one GRPO step on {nproc} ranks (gloo, one thread each) vs one process")
    for column in ("what runs", "median ms", "vs one process"):
        table.add_column(column, justify="right")
    table.add_row(f"one process, {nproc} threads", f"{single * 1000:.0f}", "1.00x")
    for arm, seconds in times.items():
        table.add_row(f"{nproc} ranks, {arm}", f"{seconds * 1000:.0f}", f"{seconds / single:.2f}x")
    console.print(table)
    mib = 1024 * 1024
    held = Table(title=f"per rank, {memory.name} + LoRA, after one step")
    for column in ("sharding", "weights + AdamW state MiB", "peak RSS MiB"):
        held.add_column(column, justify="right")
    for arm, arm_figures in figures.items():
        held.add_row(
            arm,
            f"{arm_figures['held_bytes'] / mib:.0f}",
            f"{arm_figures['peak_rss_bytes'] / mib:.0f}",
        )
    console.print(held)
    saving = figures["fsdp"]["held_bytes"] / figures["ddp"]["held_bytes"]
    console.print(  # the key figure, last
        f"{nproc} ranks: DDP step {times['ddp'] / single:.2f}x and FSDP2 step "
        f"{times['fsdp'] / single:.2f}x one process; FSDP2 holds {saving:.2f}x DDP's bytes per rank"
    )


if __name__ == "__main__":
    # The rank side: SHARDING REPEATS BATCH_FILE LAYERS WIDTH VOCABULARY OUT.
    kind, repeats, batch_file, *sizes, out = sys.argv[1:]
    memory = MemoryModel(*(int(size) for size in sizes))
    rank_main("fsdp" if kind == "fsdp" else "ddp", int(repeats), batch_file, memory, out)
    # Past the interpreter's finalization, as the trainer's ranks end: gloo's threads torn down
    # by it have aborted a finished FSDP rank ("terminate called without an active exception").
    exit_rank()
