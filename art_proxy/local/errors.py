"""Errors of the embedded inference server; the HTTP layer maps each to vLLM's status and type."""

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


class EngineFailure(LocalLlmError):
    """A forward pass failed; the requests in the batch end with this error (500)."""


class PromptError(LocalLlmError):
    """Messages or tools the chat template cannot render (400, param "messages")."""
