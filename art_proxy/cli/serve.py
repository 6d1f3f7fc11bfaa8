"""`art-proxy serve`: the recording proxy in front of the upstream(s)."""

from __future__ import annotations

import typer

from art_proxy.cli.options import settings_command
from art_proxy.cli.output import configure_logging, fail
from art_proxy.config import ProxySettings
from art_proxy.errors import ConfigError, StoreError


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "serve",
        ProxySettings,
        "Serve the recording proxy in front of the upstream(s).",
    )(serve)


def serve(settings: ProxySettings) -> None:
    from art_proxy.ports import refuse_taken_port
    from art_proxy.proxy.server import serve as serve_forever

    configure_logging(settings.log_level)
    try:
        # Before the store's migrations and the upstream's first answer: said at once.
        refuse_taken_port(settings.host, settings.port, "--port", command="art-proxy serve")
        serve_forever(settings)
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
