"""Runtime LoRA adapters on the live model, several at once, chosen per row of a batch.

peft routes each row of a forward pass through its own adapter (`adapter_names=[...]`, with
"__base__" for the base model), so requests for different adapters share a batch. Every change to
the model runs on the engine thread between two forward passes. Clients name adapters freely
("policy@3"); inside peft each load gets a fresh name, so an adapter unloaded while some rows still
generate with it stays in the model until they finish, and its name can be reused at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftConfig, PeftModel, PeftType

from art_proxy.local.errors import AdapterExists, AdapterLoadFailed, AdapterNotFound

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch
_CONFIG_FILE = "adapter_config.json"


@dataclass(eq=False)
class Adapter:
    name: str  # as clients call it
    path: str
    peft_name: str  # as peft knows it
    rows: int = 0  # rows in flight that use it
    retired: bool = False  # unloaded by a client; deleted from the model once `rows` is 0


class AdapterRegistry:
    def __init__(self, base: torch.nn.Module) -> None:
        self._base = base
        self._peft: PeftModel | None = None
        self._loaded: dict[str, Adapter] = {}  # in load order, which /v1/models follows
        self._retired: list[Adapter] = []
        self._loads = 0
        # Requests acquire adapters on the event loop while the engine thread loads and unloads.
        self._lock = threading.Lock()

    @property
    def model(self) -> torch.nn.Module:
        return self._peft if self._peft is not None else self._base

    def paths(self) -> dict[str, str]:
        with self._lock:
            return {name: adapter.path for name, adapter in self._loaded.items()}

    def acquire(self, name: str, rows: int) -> Adapter | None:
        """The adapter `name` for `rows` new rows; None if no such adapter is loaded."""
        with self._lock:
            adapter = self._loaded.get(name)
            if adapter is not None:
                adapter.rows += rows
            return adapter

    def release(self, adapter: Adapter) -> None:
        with self._lock:
            adapter.rows -= 1

    def forward_kwargs(self, adapters: list[Adapter | None]) -> dict[str, Any]:
        if self._peft is None:
            return {}
        return {"adapter_names": [a.peft_name if a else BASE_ADAPTER for a in adapters]}

    # -- engine thread only ------------------------------------------------------------------

    def load(self, name: str, path: str, *, replace: bool = False) -> None:
        """Load the adapter in `path` as `name`; `replace` swaps it for a loaded one of that name."""
        with self._lock:
            if name in self._loaded and not replace:
                raise AdapterExists(
                    f"The lora adapter '{name}' has already been loaded. If you want to load the "
                    "adapter in place, set 'load_inplace' to True."
                )
        if not (Path(path) / _CONFIG_FILE).is_file():
            raise AdapterNotFound(f"Loading lora {name} failed: No adapter found for {path}")
        self._loads += 1
        peft_name = f"lora{self._loads}"
        try:
            self._load_into_model(peft_name, path)
        except Exception as exc:
            # Anything from peft, safetensors or torch: a bad adapter must not take the server down.
            self._remove_from_model(peft_name)
            raise AdapterLoadFailed(f"Loading lora {name} failed: {exc}") from exc
        with self._lock:
            previous = self._loaded.get(name)
            if previous is not None:
                # Rows in flight finish on the old weights; new requests get the new ones.
                previous.retired = True
                self._retired.append(previous)
            self._loaded[name] = Adapter(name, path, peft_name)
        self.collect()

    def unload(self, name: str) -> None:
        with self._lock:
            adapter = self._loaded.pop(name, None)
            if adapter is None:
                raise AdapterNotFound(f"The lora adapter '{name}' cannot be found.")
            adapter.retired = True
            self._retired.append(adapter)
        self.collect()

    def collect(self) -> None:
        """Delete retired adapters that no row uses any more."""
        with self._lock:
            done = [adapter for adapter in self._retired if adapter.rows == 0]
            self._retired = [adapter for adapter in self._retired if adapter.rows > 0]
        for adapter in done:
            self._remove_from_model(adapter.peft_name)

    def close(self) -> None:
        """Give the base model back without any adapter layers (a later engine may reuse it)."""
        if self._peft is not None:
            self._base = self._peft.unload()
            self._peft = None
        with self._lock:
            self._loaded.clear()
            self._retired.clear()

    def _load_into_model(self, peft_name: str, path: str) -> None:
        config = PeftConfig.from_pretrained(path)
        if config.peft_type != PeftType.LORA:
            raise ValueError(f"only LoRA adapters can be served, this one is {config.peft_type}")
        config.inference_mode = True
        if self._peft is None:
            self._peft = PeftModel(self._base, config, adapter_name=peft_name)
        self._peft.load_adapter(path, adapter_name=peft_name)
        self._peft.eval()

    def _remove_from_model(self, peft_name: str) -> None:
        peft = self._peft
        if peft is None or peft_name not in peft.peft_config:
            return
        if len(peft.peft_config) == 1:
            # peft cannot hold zero adapters; unwrapping restores the plain base model.
            self._base = peft.unload()
            self._peft = None
        else:
            peft.delete_adapter(peft_name)
