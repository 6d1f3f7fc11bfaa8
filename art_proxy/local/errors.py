"""Errors of the embedded inference server; `served` maps each to vLLM's status and type.

A failed generation and an unrenderable prompt are the engine seam's own (`vllm_api.engine`:
`EngineFailure`, `PromptError`), since the shared server words them.
"""

from __future__ import annotations


class LocalLlmError(Exception):
    """Base of the errors below."""


class ModelLoadError(LocalLlmError):
    """The model cannot be found or loaded (a one-line CLI message)."""


class AdapterExists(LocalLlmError):
    """A LoRA adapter of that name is already loaded (vLLM: 400 InvalidUserInput)."""


class AdapterNotFound(LocalLlmError):
    """No adapter at that path, or none of that name (vLLM: 404)."""


class AdapterLoadFailed(LocalLlmError):
    """The adapter exists but could not be loaded, e.g. corrupt weights (vLLM: 500)."""
