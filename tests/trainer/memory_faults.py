"""A forward that runs out of memory past a size, as a GPU would: the trainer's scoring seam.

CPUs raise no `torch.OutOfMemoryError`; the trainer's own forward (`step.score_sampled`) is
replaced by one that raises it for more rows, or a longer sequence, than given and otherwise
scores as the real one does.
"""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel

from art_proxy_trainer import scoring
from art_proxy_trainer import step as step_module
from art_proxy_trainer.scoring import Scored


def out_of_memory_past(
    monkeypatch: pytest.MonkeyPatch, *, rows: int = 1 << 30, length: int = 1 << 30
) -> list[int]:
    """Every forward of more than `rows` rows or `length` positions runs out of memory; returns
    the row counts of the forwards that ran."""
    real = scoring.score_sampled
    ran: list[int] = []

    def scored(model: PeftModel, tokens_B_T: torch.Tensor, *args: object) -> Scored:
        if tokens_B_T.shape[0] > rows or tokens_B_T.shape[1] > length:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        ran.append(int(tokens_B_T.shape[0]))
        return real(model, tokens_B_T, *args)  # type: ignore[arg-type]  # the real signature

    monkeypatch.setattr(step_module, "score_sampled", scored)
    return ran
