"""`make demo`'s first step: the stack's ports are free, checked before the setup that takes
minutes on a fresh clone (`art-proxy up` checks again, with its own flags). Standard library
only: it runs before the project's environment exists."""

from __future__ import annotations

import os
import socket
import sys

# The ports `art-proxy up` takes, by the variables that move them (docs/cli.md), and defaults.
PORTS = (("ART_PROXY_PORT", 8100), ("ART_PROXY_LLM_PORT", 8000))


def main() -> int:
    taken = 0
    for variable, default in PORTS:
        port = int(os.environ.get(variable, default))
        with socket.socket() as probe:
            probe.settimeout(1.0)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken += 1
                print(
                    f"error: port {port} is taken (another art-proxy, vLLM or local-llm still "
                    f"running?): stop it, or set {variable}, e.g. {variable}={port + 1} make demo",
                    file=sys.stderr,
                )
    return 1 if taken else 0


if __name__ == "__main__":
    sys.exit(main())
