"""One GRPO step on a fixed batch, by one process or by each rank of several (under torchrun).

`python -m tests.trainer.ranks_step OUT_DIR ROWS SHARDING...` under `torchrun --nproc-per-node N`:
for each SHARDING (ddp or fsdp) in turn, a fresh policy whose ranks each train their share of the
first ROWS rows of `fixed_batch()` in lockstep; rank 0 writes the loss, the gradient norm and the
adapter after the step, gathered whole as a checkpoint holds it, to OUT_DIR/SHARDING.pt, for
tests/trainer/test_distributed.py to compare. One launch takes every sharding: a rank's start
(torch, transformers and peft imported) costs more than its step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from peft import PeftModel

from art_proxy.config import TrainerConfig
from art_proxy_trainer.batch import SequenceStats, TrainingBatch
from art_proxy_trainer.distributed import Ranks, Replica, Sharding, exit_rank, join, leave
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.policy import Policy
from art_proxy_trainer.scoring import token_logprobs
from tests.trainer.models import tiny_llama

# Small micro-batches, so ranks make different numbers of passes; the KL term runs the
# reference (adapter off) pass too.
CONFIG = TrainerConfig(learning_rate=1e-2, micro_batch_tokens=24, kl_coef=0.05)
ROW_LENGTHS = [12, 10, 8, 6, 4]


def policy() -> Policy:
    model = lora_model(tiny_llama(), CONFIG)
    return Policy(model, make_optimizer(model, CONFIG), 0, "tiny", {"tiny"})


def fixed_batch(model: PeftModel) -> TrainingBatch:
    """Rows of several lengths, right-padded, sampled by a policy a little off the current one."""
    generator = torch.Generator().manual_seed(7)
    rows, length = len(ROW_LENGTHS), max(ROW_LENGTHS)
    tokens_B_T = torch.randint(1, 128, (rows, length), generator=generator)
    attention_mask_B_T = torch.zeros(rows, length, dtype=torch.int64)
    mask_B_T = torch.zeros(rows, length)
    for row, row_length in enumerate(ROW_LENGTHS):
        attention_mask_B_T[row, :row_length] = 1
        mask_B_T[row, row_length // 2 : row_length] = 1.0
        tokens_B_T[row, row_length:] = 0
    with torch.no_grad():
        logits = model(input_ids=tokens_B_T, attention_mask=attention_mask_B_T).logits
    noise_B_T = 0.05 * torch.randn(rows, length, generator=generator)
    old_logprobs_B_T = (token_logprobs(logits, tokens_B_T) + noise_B_T) * mask_B_T
    advantages_B = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75])
    return TrainingBatch(
        tokens_B_T,
        attention_mask_B_T,
        mask_B_T,
        old_logprobs_B_T,
        advantages_B,
        SequenceStats(sequences=rows),
    )


def lora_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    return {
        name: parameter.detach().clone()
        for name, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def main(out_dir: Path, rows: int, shardings: list[Sharding]) -> None:
    ranks = Ranks.of_environment()
    assert ranks is not None, "run under torchrun with --nproc-per-node 2 or more"
    join(ranks, 120, torch.device("cpu"))
    try:
        for sharding in shardings:
            _step(ranks, rows, sharding, out_dir / f"{sharding}.pt")
    finally:
        leave()


def _step(ranks: Ranks, rows: int, sharding: Sharding, out: Path) -> None:
    replica: Replica | None = None
    try:
        trained = policy()
        batch = fixed_batch(trained.model).take(list(range(rows)))
        replica = Replica(trained, ranks, sharding, CONFIG, torch.device("cpu"))
        # A checkpoint before the first step (a run whose first steps had no signal) must not
        # count a step the optimiser never took.
        replica.gather()
        result = replica.train(batch, CONFIG)
        gathered = replica.gather()
        if gathered is not None:
            torch.save(
                {
                    "applied": result.applied,
                    "loss": result.loss,
                    "grad_norm": result.grad_norm,
                    "weights": gathered.adapter,
                },
                out,
            )
    finally:
        if replica is not None:
            replica.close()


if __name__ == "__main__":
    shardings: list[Sharding] = ["fsdp" if kind == "fsdp" else "ddp" for kind in sys.argv[3:]]
    main(Path(sys.argv[1]), int(sys.argv[2]), shardings)
    # As the trainer's ranks do: a finished rank ends past the interpreter's finalization, where
    # gloo's threads aborted a finished FSDP rank once in CI (SIGABRT, "terminate called ...").
    exit_rank()
