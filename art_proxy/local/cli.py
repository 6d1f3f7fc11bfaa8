"""`art-proxy local-llm`: its settings, and running the server until SIGINT/SIGTERM.

Importing this module costs only pydantic, so the main CLI can register the command without
loading torch; `run_local_llm` imports the heavy parts when it starts.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from art_proxy import serving

if TYPE_CHECKING:
    import torch

    from art_proxy.local.served import ServedModel


class LocalLlmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(
        None,
        description="A local Hugging Face model directory or .gguf file (unset = the bundled "
        "SmolLM2-135M-Instruct). Nothing is downloaded.",
    )
    served_model_name: str | None = Field(
        None,
        description="Name clients call the base model by (unset = SmolLM2-135M-Instruct for "
        "the bundled model, else the --model value, as vLLM does).",
    )
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0 = any free port).")
    max_batch_size: int = Field(
        32, ge=1, description="Most sequences generated at once; more requests wait for a slot."
    )
    max_model_len: int = Field(
        2048, ge=0, description="Context length in tokens, prompt included (0 = the model's)."
    )
    threads: int = Field(
        0, ge=0, description="CPU threads for torch (0 = one per core the process may use)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the model runs: auto, the first CUDA device where torch has one, "
        "else the CPU.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="The weights' dtype, as vLLM's --dtype: auto, bfloat16 on CUDA and float32 "
        "on a CPU. The trainer corrects for the numerics it does not share with importance "
        "weights.",
    )
    cache_dir: str | None = Field(
        None,
        description="Where a .gguf model is cached once converted "
        "(unset = ~/.cache/art-proxy/models).",
    )


def run_local_llm(settings: LocalLlmSettings) -> None:
    """Load the model, then serve until interrupted; prints a ready line once listening."""
    quiet_library_warnings()
    serving.run(_serve_until_stopped(settings))


def quiet_library_warnings() -> None:
    """Keep the libraries' notes to their own developers out of a server's output (`up` relays
    it line by line): transformers' and torch's deprecations (FutureWarning, and transformers'
    own logger's, such as `past_key_values` on every first generation), and peft's note each time
    an adapter that was last active is unloaded, which the server does by design."""
    from transformers.utils import logging as transformers_logging

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"Adapter .* was active which is now deleted")
    transformers_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers leaves it untyped


async def _serve_until_stopped(settings: LocalLlmSettings) -> None:
    started = time.monotonic()
    stage = ["loading the model"]

    def say(what: str) -> None:
        stage[0] = what
        print(f"local-llm: {what}...", file=sys.stderr, flush=True)

    loading = asyncio.ensure_future(asyncio.to_thread(_load, settings, say))
    # A busy machine takes minutes over torch's import and the first start's conversion: a line
    # every so often says it is still at work, and at what.
    while not loading.done():
        await asyncio.wait({loading}, timeout=_STILL_LOADING_EVERY_S)
        if not loading.done():
            elapsed = time.monotonic() - started
            print(f"local-llm: still {stage[0]} ({elapsed:.0f} s)", file=sys.stderr, flush=True)
    served = loading.result()
    from art_proxy.local.server import running_local_llm

    stop = serving.stop_requested()
    async with running_local_llm(served, settings.host, settings.port) as local:
        print(
            f"local-llm ready: {local.base_url} (model {served.name}, "
            f"{time.monotonic() - started:.0f} s to start)",
            flush=True,
        )
        await stop.wait()


def _load(settings: LocalLlmSettings, say: Callable[[str], None]) -> ServedModel:
    """The model, loaded and ready to serve (in a thread: the imports take seconds too)."""
    say("importing torch and transformers")
    import torch

    from art_proxy.local.model_loading import load_model, weights_dtype
    from art_proxy.local.served import ServedModel

    set_torch_threads(settings.threads)
    device = serving_device(settings.device)
    dtype = weights_dtype(settings.dtype, device)
    say(f"loading the model ({str(dtype).removeprefix('torch.')} on {device})")
    loaded = load_model(settings.model, cache_dir=settings.cache_dir, dtype=dtype, say=say)
    torch.nn.Module.to(loaded.model, device)  # in place; transformers types `to` too narrowly
    return ServedModel.create(
        loaded,
        served_model_name=settings.served_model_name,
        max_model_len=settings.max_model_len,
        max_batch_size=settings.max_batch_size,
    )


_STILL_LOADING_EVERY_S = 15.0


def serving_device(choice: Literal["auto", "cpu", "cuda"]) -> torch.device:
    """The device `--device` names; `cuda` where torch has none is refused in one line."""
    import torch

    from art_proxy.local.errors import ModelLoadError

    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        raise ModelLoadError(
            f"--device cuda: torch {torch.__version__} sees no CUDA device here "
            "(a CPU build, or no GPU): --device cpu, or auto"
        )
    return torch.device("cuda" if choice == "cuda" or (choice == "auto" and available) else "cpu")


def set_torch_threads(threads: int) -> None:
    """torch's CPU threads: `threads`, or one per core this process may use (0). Two torch
    processes on the same cores (local-llm and the trainer) contend; giving each its share helps."""
    import torch

    torch.set_num_threads(threads or usable_cores())


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
