"""`art-proxy local-llm`: a model on CPU behind vLLM's OpenAI API (art_proxy/local)."""

from __future__ import annotations

import typer

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import configure_logging, fail
from art_proxy.errors import ConfigError
from art_proxy.local.cli import LocalLlmSettings


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "local-llm",
        LocalLlmSettings,
        "Serve a model on CPU behind vLLM's OpenAI API, runtime LoRA included (no GPU, no vLLM).",
    )(local_llm)


def local_llm(settings: LocalLlmSettings) -> None:
    from art_proxy.local import missing_local_packages
    from art_proxy.ports import refuse_taken_port

    try:
        refuse_taken_port(settings.host, settings.port, "--port", command="art-proxy local-llm")
    except ConfigError as exc:  # before the model's load: a taken port is said at once
        fail(str(exc))

    missing = missing_local_packages("local-llm")
    if missing is not None:
        fail(missing)
    # Imported here: torch and transformers load only when this command runs.
    from art_proxy.local.cli import run_local_llm
    from art_proxy.local.errors import ModelLoadError

    configure_logging()
    try:
        run_local_llm(settings)
    except (ModelLoadError, OSError) as exc:
        fail(str(exc))
