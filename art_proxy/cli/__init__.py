"""`art-proxy`: the command line, one module per command or command group, the typer app
assembled in `app.py`. Each command's flags come from its settings model (config/), declared
once on its fields (`options.py`)."""

from art_proxy.cli.app import app, main

__all__ = ["app", "main"]
