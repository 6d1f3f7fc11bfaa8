"""The proxy's image (Containerfile), built on this machine and run: `art-proxy serve` from the image
in front of local-llm on the host records into the host's PostgreSQL.

No container registry is reachable here, and podman cannot run containers under this kernel, but
buildah builds and runs with `--isolation chroot` (Debian's buildah, installed by `make setup`).
The base image is Debian bookworm made from Debian's packages by mmdebstrap, trusting this
machine's CA bundle, and committed once (`localhost/art-proxy-base:bookworm-host-ca`, kept in
buildah's storage for the next run), passed as the Containerfile's `BASE`. The dependency layer is cached (`--layers`) until pyproject.toml changes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from art_proxy.local.server import RunningLocalLlm
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.loopback import free_port

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/art-proxy-base:bookworm-host-ca"
IMAGE = "localhost/art-proxy:test"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# What the Containerfile needs of a base: Python with venv, HTTPS to the package index, useradd.
BASE_PACKAGES = "python3,python3-venv,ca-certificates,passwd"


def _run(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-3000:]}"
    return done.stdout.strip()


def _has_image(name: str) -> bool:
    found = subprocess.run(
        ["buildah", "images", "--quiet", name], capture_output=True, text=True, check=False
    )
    return found.returncode == 0 and bool(found.stdout.strip())


@pytest.fixture(scope="module")
def proxy_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    for tool in ("buildah", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (make setup installs Debian's)")
    if os.geteuid() != 0:
        pytest.skip("buildah's chroot isolation runs as root here")
    if not _has_image(BASE):
        tarball = tmp_path_factory.mktemp("base") / "bookworm.tar"
        _run(
            "mmdebstrap", "--variant=apt", f"--include={BASE_PACKAGES}", "bookworm", str(tarball),
            timeout=1200,
        )  # fmt: skip
        container = _run("buildah", "from", "scratch")
        _run("buildah", "add", container, str(tarball), "/")
        # This machine reaches the package index through a proxy whose certificate only its
        # own CA bundle vouches for: the base trusts what the machine trusts, as a company's
        # base image does, and pip is told where that is.
        if HOST_CA.is_file():
            _run("buildah", "copy", container, str(HOST_CA), str(HOST_CA))
            _run("buildah", "config", "--env", f"PIP_CERT={HOST_CA}", container)
        _run("buildah", "commit", "--rm", container, BASE)
    _run(
        "buildah", "bud", "--isolation", "chroot", "--layers", "--file", str(ROOT / "Containerfile"),
        "--target", "proxy", "--build-arg", f"BASE={BASE}", "--tag", IMAGE, str(ROOT),
        timeout=1800,
    )  # fmt: skip
    return IMAGE


@pytest.fixture
async def served_from_image(
    proxy_image: str, local_llm: RunningLocalLlm, postgres_url: str
) -> AsyncIterator[str]:
    """`art-proxy serve` run from the image (the host's network): its root URL."""
    container = _run("buildah", "from", proxy_image)
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        "buildah", "run", "--isolation", "chroot", container, "--",
        "art-proxy", "serve", "--upstream", local_llm.base_url, "--store", postgres_url,
        "--port", str(port), "--journal", "/journal",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        await _healthy(root, process)
        yield root
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
        _run("buildah", "rm", container)


async def _healthy(root: str, process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 120
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                output = await process.stdout.read() if process.stdout else b""
                pytest.fail(f"the image's proxy exited: {output.decode()[-2000:]}")
            try:
                async with http.get(f"{root}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    pytest.fail("the image's proxy did not answer /health within 120 s")


async def test_the_proxy_image_serves_and_records_into_the_hosts_postgres(
    served_from_image: str, local_llm: RunningLocalLlm, postgres_url: str
) -> None:
    async with openai.AsyncOpenAI(base_url=f"{served_from_image}/v1", api_key="unused") as client:
        model = (await client.models.list()).data[0].id
        for n in range(2):
            answer = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Say hello {n}."}],
                max_tokens=8,
                extra_headers={"X-Art-Trajectory": f"from-image-{n}"},
            )
            assert answer.choices[0].message.content
    deadline = time.monotonic() + 30  # the proxy's journal moves the records into the store
    async with TrajectoryStore.opened(postgres_url, writer=False) as store:
        calls = await store.calls(["from-image-0", "from-image-1"])
        while len(calls) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            calls = await store.calls(["from-image-0", "from-image-1"])
    assert sorted(calls) == ["from-image-0", "from-image-1"]
    for recorded in calls.values():
        [call] = recorded
        assert call.trainable and call.prompt_token_ids and call.completion_token_ids
