"""The proxy's image (Containerfile), built on this machine and run: its own default command as the
docs run it, `art-proxy serve` from the image in front of local-llm on the host recording into the
host's PostgreSQL, the compose file's proxy service as compose starts it (local-llm and the host's
PostgreSQL for its vLLM and PostgreSQL services: no GPU here, and no container runtime but
buildah's), and a container killed with records journaled while the store was down, whose journal a
fresh container on the same volume moves into the store.

No container registry is reachable here, and podman cannot run containers under this kernel, but
buildah builds and runs with `--isolation chroot` (Debian's buildah, installed by `make setup`).
The base image is Debian bookworm made from Debian's packages by mmdebstrap, trusting this
machine's CA bundle, and committed once (`localhost/art-proxy-base:bookworm-host-ca`, kept in
buildah's storage for the next run), passed as the Containerfile's `BASE`. The dependency layer is
cached (`--layers`) until pyproject.toml or deploy/constraints.txt changes. The image is built in
Docker's format, which keeps its HEALTHCHECK (OCI's has none).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import yaml

from art_proxy.local.server import RunningLocalLlm
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fault_tcp import faulty_tcp
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
        "--target", "proxy", "--format", "docker", "--build-arg", f"BASE={BASE}", "--tag", IMAGE,
        str(ROOT),
        timeout=1800,
    )  # fmt: skip
    return IMAGE


class _Container:
    """A container of the image and its one process (the host's network)."""

    def __init__(self, image: str, *run_options: str) -> None:
        self.name = _run("buildah", "from", image)
        self._options = run_options
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, *argv: str) -> asyncio.subprocess.Process:
        self.process = await asyncio.create_subprocess_exec(
            "buildah", "run", "--isolation", "chroot", *self._options, self.name, "--", *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self.process

    async def stop(self, signal_number: int = signal.SIGTERM) -> int | None:
        """SIGTERM to the container's own process, as `docker stop` sends it (buildah, sent
        one, kills its container); SIGKILL to them all. The container's exit status."""
        process = self.process
        if process is not None and process.returncode is None:
            if signal_number == signal.SIGKILL:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                own = _run("pgrep", "--session", str(process.pid), "--exact", "art-proxy")
                for pid in own.split():
                    os.kill(int(pid), signal_number)
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        return None if process is None else process.returncode

    async def remove(self) -> None:
        await self.stop(signal.SIGKILL)
        _run("buildah", "rm", self.name)


@pytest.fixture
async def served_from_image(
    proxy_image: str, local_llm: RunningLocalLlm, postgres_url: str
) -> AsyncIterator[str]:
    """`art-proxy serve` run from the image (the host's network): its root URL."""
    container = _Container(proxy_image)
    port = free_port()
    process = await container.start(
        "art-proxy", "serve", "--upstream", local_llm.base_url, "--store", postgres_url,
        "--port", str(port), "--journal", "/journal",
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        await _healthy(root, process)
        yield root
    finally:
        await container.remove()


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


def _config(image: str) -> dict[str, Any]:
    """The image's configuration as Docker's format holds it (Entrypoint, Cmd, Healthcheck...)."""
    config: dict[str, Any] = json.loads(_run("buildah", "inspect", "--type", "image", image))
    return dict(config["Docker"]["config"])


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


async def test_the_images_default_command_serves_as_the_docs_run_it(
    proxy_image: str, local_llm: RunningLocalLlm
) -> None:
    """`docker run -e ART_PROXY_UPSTREAM=... art-proxy`: the image's entrypoint and command
    as they are, the upstream from the environment; it answers and records (into the SQLite
    store in its home), its HEALTHCHECK passes, and SIGTERM stops it cleanly."""
    config = _config(proxy_image)
    argv = [*config["Entrypoint"], *config["Cmd"]]
    port = int(argv[argv.index("--port") + 1])
    if not _port_free(port):
        pytest.skip(f"the image's port {port} is taken on this machine")
    container = _Container(proxy_image, "--env", f"ART_PROXY_UPSTREAM={local_llm.base_url}")
    root = f"http://127.0.0.1:{port}"
    try:
        process = await container.start(*argv)
        await _healthy(root, process)
        check = config["Healthcheck"]["Test"]
        assert check[0] == "CMD"
        _run("buildah", "run", "--isolation", "chroot", container.name, "--", *check[1:])
        async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="unused") as client:
            model = (await client.models.list()).data[0].id
            await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=4,
                extra_headers={"X-Art-Trajectory": "default-command"},
            )
        async with aiohttp.ClientSession() as http:  # the admin API, from the loopback
            deadline = time.monotonic() + 30
            while True:
                async with http.get(f"{root}/art/v1/trajectories/default-command") as response:
                    if response.status == 200 or time.monotonic() > deadline:
                        body = await response.json()
                        break
                await asyncio.sleep(0.5)
        assert response.status == 200, body
        assert len(body["calls"]) == 1
        assert await container.stop(signal.SIGTERM) == 0
    finally:
        await container.remove()


async def test_a_fresh_container_on_the_same_journal_loses_nothing_a_killed_one_answered(
    proxy_image: str, local_llm: RunningLocalLlm, postgres_url: str, tmp_path: Path
) -> None:
    """What a rescheduled pod meets: the store down, calls answered and journaled, the
    container killed before its drain; a fresh container (nothing of the old one but the
    journal's volume, as a StatefulSet's claim) moves every record into the store."""
    journal = tmp_path / "journal"
    journal.mkdir()
    os.chown(journal, 10001, 10001)  # the image's user, as fsGroup makes it on a claim
    mount = ("--volume", f"{journal}:/journal")
    ids = [f"journaled-{n}" for n in range(5)]
    # One store URL for both containers (a journal serves one store), PostgreSQL behind a relay
    # that refuses connections while it is "down".
    async with faulty_tcp("127.0.0.1", 5432) as relay:
        store = postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{relay.port}")
        assert store != postgres_url
        await relay.refuse()
        await _kill_with_records_journaled(proxy_image, mount, local_llm, store, ids)
        await relay.restore()
        second = _Container(proxy_image, *mount)
        try:
            port = free_port()
            serve = ["art-proxy", "serve", "--upstream", local_llm.base_url, "--store", store,
                     "--port", str(port), "--journal", "/journal"]  # fmt: skip
            await _healthy(f"http://127.0.0.1:{port}", await second.start(*serve))
            deadline = time.monotonic() + 60
            async with TrajectoryStore.opened(postgres_url, writer=False) as opened:
                calls = await opened.calls(ids)
                while len(calls) < len(ids) and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    calls = await opened.calls(ids)
            assert sorted(calls) == ids
        finally:
            await second.remove()


async def _kill_with_records_journaled(
    image: str, mount: tuple[str, ...], local_llm: RunningLocalLlm, store: str, ids: list[str]
) -> None:
    first = _Container(image, *mount)
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    try:
        process = await first.start(
            "art-proxy", "serve", "--upstream", local_llm.base_url, "--store", store,
            "--port", str(port), "--journal", "/journal",
        )  # fmt: skip
        await _healthy(root, process)
        async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="unused") as client:
            model = (await client.models.list()).data[0].id
            for trajectory in ids:
                await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Say {trajectory}."}],
                    max_tokens=4,
                    extra_headers={"X-Art-Trajectory": trajectory},
                )
        async with aiohttp.ClientSession() as http, http.get(f"{root}/health") as response:
            health = await response.json()
        assert health["journal"]["store"] == "unavailable", health
        assert health["journal"]["backlog_frames"] >= len(ids), health
        await first.stop(signal.SIGKILL)
    finally:
        await first.remove()


def _interpolated(value: str, environment: dict[str, str]) -> str:
    """Compose's interpolation of the forms the compose file uses: ${NAME}, ${NAME:-default},
    ${NAME:?message} (an error where NAME is unset or empty)."""

    def one(match: re.Match[str]) -> str:
        name, form, rest = match.group(1), match.group(2) or "", match.group(3) or ""
        value = environment.get(name, "")
        if form == ":?" and not value:
            raise KeyError(f"{name}: {rest}")
        return value or (rest if form == ":-" else "")

    return re.sub(r"\$\{(\w+)(:\?|:-)?([^}]*)\}", one, value)


async def test_the_compose_files_proxy_runs_from_the_image_as_compose_starts_it(
    proxy_image: str, local_llm: RunningLocalLlm, postgres_url: str, tmp_path: Path
) -> None:
    """The compose file's proxy service, its command and environment as compose hands them to
    the image (the secrets from the operator's environment), vLLM's and PostgreSQL's service
    names pointed at local-llm and the host's PostgreSQL: ready, recording, and its admin API
    answering only with the key."""
    service = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]["proxy"]
    operator = {"POSTGRES_PASSWORD": "s3cret-pw", "ART_PROXY_ADMIN_KEY": "k" * 64}
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):  # compose refuses without it
        _interpolated(service["environment"]["ART_PROXY_STORE"], {})
    environment = {k: _interpolated(v, operator) for k, v in service["environment"].items()}
    assert environment["ART_PROXY_STORE"] == "postgresql://art:s3cret-pw@postgres:5432/art"
    # The host's PostgreSQL (trust auth, a database of its own) stands for the `postgres` service.
    environment["ART_PROXY_STORE"] = postgres_url
    port = free_port()
    command = [
        word.replace("http://vllm:8000/v1", local_llm.base_url).replace("--port=8100", f"--port={port}")
        for word in (_interpolated(w, operator) for w in service["command"])
    ]  # fmt: skip
    assert not any("s3cret" in word for word in command)  # nothing secret on the command line
    journal = tmp_path / "journal"
    journal.mkdir()
    os.chown(journal, 10001, 10001)
    options = ["--volume", f"{journal}:/journal"]
    for name, value in environment.items():
        options += ["--env", f"{name}={value}"]
    container = _Container(proxy_image, *options)
    root = f"http://127.0.0.1:{port}"
    try:
        await _healthy(root, await container.start("art-proxy", *command))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{root}/ready") as ready:
                assert ready.status == 200, await ready.text()
            async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key="unused") as client:
                model = (await client.models.list()).data[0].id
                await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "Say hello."}],
                    max_tokens=4,
                    extra_headers={"X-Art-Trajectory": "from-compose"},
                )
            path = f"{root}/art/v1/trajectories/from-compose"
            async with http.get(path) as keyless:
                assert keyless.status == 401, await keyless.text()
            key = {"Authorization": f"Bearer {operator['ART_PROXY_ADMIN_KEY']}"}
            deadline = time.monotonic() + 30
            while True:
                async with http.get(path, headers=key) as read:
                    if read.status == 200 or time.monotonic() > deadline:
                        assert read.status == 200, await read.text()
                        break
                await asyncio.sleep(0.5)
        assert await container.stop(signal.SIGTERM) == 0
    finally:
        await container.remove()
