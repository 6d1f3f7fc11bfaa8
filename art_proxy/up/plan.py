"""What `art-proxy up` starts: the inference server (local-llm, or vLLM and its share of a GPU),
the proxy, and the commands run against them (the whole loop's `train`, then `eval`)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

from art_proxy.config import Engine, LogLevel, TrainerConfig, UpSettings
from art_proxy.errors import ConfigError
from art_proxy.local import missing_local_packages
from art_proxy.ports import refuse_taken_port
from art_proxy.up.parts import Part, flags
from art_proxy.up.vllm import VllmLaunch

# vLLM's share of one GPU the trainer also trains on when the model's size or the GPU's cannot be
# read (a hub id not in the local cache, torch without CUDA beside a CUDA vLLM).
ONE_GPU_VLLM_SHARE = 0.5


def one_gpu_share(settings: UpSettings, model_dir: str) -> float:
    """vLLM's share of the GPU the whole loop's trainer trains on: what the trainer's step leaves
    by `art_proxy_trainer.memory` (docs/training.md, One GPU), from the model's config and
    the GPU's size. ConfigError when vLLM cannot fit beside the trainer."""
    try:
        import torch
        from transformers import AutoConfig

        from art_proxy_trainer.memory import GB, ModelShape, vllm_share

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    except (ImportError, OSError, ValueError, RuntimeError, AssertionError):
        return ONE_GPU_VLLM_SHARE
    shape = ModelShape.of(config, model_dir)
    share = vllm_share(
        shape,
        gpu_bytes,
        micro_batch_tokens=TrainerConfig().micro_batch_tokens,
        lora_rank=settings.lora_rank,
        sleeping=settings.sleep_mode,
    )
    if share is None:
        raise ConfigError(
            f"{model_dir} does not fit beside the trainer on this {gpu_bytes / GB:.0f} GB GPU "
            f"({shape.parameters * 2 / GB:.1f} GB of bf16 weights each side): pass --sleep-mode "
            "(vLLM sleeps through each step), a smaller model, or --gpu-memory-utilization "
            "and a trainer on another GPU"
        )
    return share


def plan(settings: UpSettings) -> list[Part]:
    """The parts of the stack, in start order (with `--engine vllm`, the bundled model is
    converted first, once per machine)."""
    for flag, port in (("--llm-port", settings.llm_port), ("--port", settings.port)):
        refuse_taken_port(settings.host if flag == "--port" else "127.0.0.1", port, flag)
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    llm_url = f"http://127.0.0.1:{settings.llm_port}"
    if settings.engine is Engine.vllm:
        model = settings.model
        if model is None or model.endswith(".gguf") or Path(model).is_dir():
            # The bundled model and a GGUF file are converted, a directory's chat template read,
            # here, by art-proxy's own Python, before vLLM loads them.
            missing = missing_local_packages("up --engine vllm")
            if missing is not None:
                raise ConfigError(f"{missing} (to prepare the model for vLLM)")
        launch = VllmLaunch.of(
            settings.model,
            port=settings.llm_port,
            python=settings.vllm_python,
            max_lora_rank=settings.max_lora_rank,
            tool_call_parser=settings.tool_call_parser,
            dtype=settings.vllm_dtype,
            gpu_memory_utilization=settings.gpu_memory_utilization or None,
            sleep_mode=settings.sleep_mode,
            reasoning_parser=settings.reasoning_parser,
        )
        if settings.agent and not launch.cpu and not settings.gpu_memory_utilization:
            launch = replace(launch, gpu_memory_utilization=one_gpu_share(settings, launch.model))
        llm = Part(
            "vllm",
            launch.argv(),
            f"{llm_url}/health",
            ready_timeout_s=900,  # a GPU machine may first download the model
            color="magenta",
            env=launch.env(),
            first_request=launch.grammar_pin,
        )
    else:
        missing = missing_local_packages("up")
        if missing is not None:
            raise ConfigError(missing)
        llm = Part(
            "local-llm",
            [art_proxy, "local-llm", *flags(port=settings.llm_port, model=settings.model)],
            f"{llm_url}/health",
            ready_timeout_s=600,  # the first start converts the bundled GGUF once
            color="magenta",
        )
    proxy_flags = flags(
        upstream=f"{llm_url}/v1",
        store=settings.store,
        host=settings.host,
        port=settings.port,
        journal=settings.journal,
        durability=settings.durability.value,
        journal_max_mb=settings.journal_max_mb or None,
        log_level=None if settings.log_level is LogLevel.info else settings.log_level.value,
    )
    proxy = Part(
        "proxy",
        [art_proxy, "serve", *proxy_flags],
        f"http://{settings.host}:{settings.port}/health",
        ready_timeout_s=60,
        color="cyan",
    )
    return [llm, proxy]


def trainer_command(settings: UpSettings) -> str | None:
    """`art-proxy train` running the whole loop against this stack (None without --agent)."""
    if not settings.agent or not settings.scenarios:
        return None
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    train_flags = flags(
        agent=settings.agent,
        scenarios=settings.scenarios,
        steps=settings.steps,
        out=settings.out,
        store=settings.store,
        proxy=f"http://{settings.host}:{settings.port}",
        upstream=f"http://127.0.0.1:{settings.llm_port}/v1",
        model=settings.model,
        nproc=settings.nproc if settings.nproc > 1 else None,
        sharding=settings.sharding if settings.sharding != "ddp" else None,
        lora_rank=settings.lora_rank if "lora_rank" in settings.model_fields_set else None,
        sleep_upstreams=settings.sleep_mode,
        teacher=settings.teacher,
        teacher_context=settings.teacher_context,
    )
    return shlex.join([art_proxy, "train", *train_flags])


def eval_command(settings: UpSettings) -> str | None:
    """`art-proxy eval` of the base model against the trained adapter on the val scenarios,
    after the whole loop (None without --agent, --eval-repeats 0 or val scenarios)."""
    if not settings.agent or not settings.scenarios or not settings.eval_repeats:
        return None
    from art_proxy.scenarios import load_scenarios

    if not any(scenario.split == "val" for scenario in load_scenarios(settings.scenarios)):
        return None
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    eval_flags = flags(
        agent=settings.agent,
        scenarios=settings.scenarios,
        store=settings.store,
        proxy=f"http://{settings.host}:{settings.port}",
        repeats=settings.eval_repeats,
        out=f"{settings.out}/eval",
    )
    return shlex.join([art_proxy, "eval", *eval_flags, "--model", "base", "--model", "trained"])
