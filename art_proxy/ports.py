"""The port a server is about to take, checked before anything slow (a model's load, the store's
migrations, `up`'s parts): a taken one is said in one line at once, not after a minute's work."""

from __future__ import annotations

import socket

from art_proxy.errors import ConfigError


def refuse_taken_port(host: str, port: int, flag: str, *, command: str = "make demo") -> None:
    """ConfigError when something already listens on `host:port` (port 0: any free one, never
    taken): the server would fail to bind after its start-up, or, for `up`, start beside the
    other server and have its health checks answered by it. `command`: what the hint's example
    runs with the port moved."""
    if port == 0:
        return
    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else host, port)) == 0:
            variable = "ART_PROXY_" + flag.removeprefix("--").replace("-", "_").upper()
            raise ConfigError(
                f"port {port} on {host} is taken (another art-proxy, vLLM or local-llm still "
                f"running?): stop it, or pass {flag} with a free port (or set {variable}, "
                f"e.g. {variable}={port + 1} {command})"
            )
