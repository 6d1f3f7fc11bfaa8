"""What an operator deploys (deploy/, Containerfile): the compose file and the Kubernetes manifests
valid against their schemas (offline: the Compose Specification's, vendored in tests/schemas/, and
Kubernetes' OpenAPI schemas from `kubernetes-validate`), every art-proxy command and flag in them a
real one; Prometheus' alert rules and the Grafana dashboard checked against promtool and against
the metrics a real proxy and trainer export; and a real Prometheus (Debian's, installed by `make
setup`) scraping a proxy reads its token counter.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import jsonschema
import kubernetes_validate
import openai
import pytest
import typer.core
import typer.main
import yaml

from art_proxy.cli import app
from art_proxy.proxy.server import RunningProxy
from art_proxy.records import TrainingStep
from art_proxy.testing.loopback import free_port
from art_proxy_trainer.metrics import MetricsSink

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "deploy" / "compose.yaml"
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
CONTAINERFILE = ROOT / "Containerfile"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "art-proxy.json"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
_NAME = re.compile(r"\bart_proxy_[a-z_]+")
_SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads((ROOT / "tests" / "schemas" / "compose-spec.json").read_text())
    compose = yaml.safe_load(COMPOSE.read_text())
    jsonschema.Draft7Validator(schema).validate(compose)  # the schema names draft 07
    # The trainer writes adapters where vLLM loads them from: one volume, one path, in both.
    mounts = {
        name: set(service.get("volumes", [])) for name, service in compose["services"].items()
    }
    assert "adapters:/adapters" in mounts["vllm"] & mounts["trainer"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda path: path.name)
def test_each_kubernetes_manifest_is_valid_for_kubernetes(manifest: Path) -> None:
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, "1.37.0", strict=True)


def _art_proxy_commands() -> list[tuple[str, list[str]]]:
    """Every art-proxy command line the deployment files run, with where it is."""
    found: list[tuple[str, list[str]]] = []
    compose = yaml.safe_load(COMPOSE.read_text())
    for name, service in compose["services"].items():
        # (A service that runs another entrypoint of the image runs no art-proxy command.)
        if str(service.get("image", "")).startswith("art-proxy") and "entrypoint" not in service:
            found.append((f"compose {name}", list(service["command"])))
    for manifest in MANIFESTS:
        for document in yaml.safe_load_all(manifest.read_text()):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container["image"].startswith("art-proxy"):
                    env = [e["name"] for e in container.get("env", [])]
                    found.append(
                        (f"{manifest.name} {container['name']}", [*container["args"], *env])
                    )
    for line in CONTAINERFILE.read_text().splitlines():
        if line.startswith("CMD "):
            found.append(("Containerfile", json.loads(line.removeprefix("CMD "))))
    return found


def test_every_command_and_flag_deployed_is_the_clis() -> None:
    """A flag renamed in the CLI and left in a manifest is a pod that exits at start: each
    command, `--flag` and `ART_PROXY_*` variable the files give art-proxy must be one of its."""
    cli = typer.main.get_command(app)
    assert isinstance(cli, typer.core.TyperGroup)
    commands = _art_proxy_commands()
    assert len(commands) >= 8
    for where, argv in commands:
        command = cli.commands.get(argv[0])
        assert command is not None, f"{where}: no command {argv[0]!r}"
        flags = {option for param in command.params for option in param.opts} | {"--help"}
        variables = {param.envvar for param in command.params if isinstance(param.envvar, str)}
        for word in argv[1:]:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in flags, f"{where}: {argv[0]} has no {word}"
            elif word.startswith("ART_PROXY_"):
                assert word in variables, f"{where}: {argv[0]} reads no {word}"


def _needs(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (make setup installs Debian's prometheus)")
    return path


def test_the_alert_rules_pass_promtool() -> None:
    checked = subprocess.run(
        [_needs("promtool"), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


def _exposed(text: str) -> set[str]:
    """Every family and sample name in Prometheus' text format."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


async def test_every_metric_the_dashboard_and_alerts_read_is_exported(
    proxy: RunningProxy, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A name misspelt in a rule or a panel is a silent alert or an empty chart: each one must
    be a name the proxy's /metrics or the trainer's textfile exports."""
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        async for _chunk in stream:
            pass
    await proxy.parts.settled()
    async with http.get(f"{proxy.root_url}/metrics") as response:
        exposed = _exposed(await response.text())
    step = TrainingStep(
        run="r",
        step=1,
        status="applied",
        metrics={"reward_mean": 0.5, "val_reward": 0.4},
        groups={},
        created_at=datetime.now(UTC),
    )
    sink = MetricsSink(tmp_path)
    with sink:
        sink.write(step)
    exposed |= _exposed(sink.prometheus_path.read_text())

    read = set(_NAME.findall(ALERTS.read_text()))
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        for target in panel["targets"]:
            read |= set(_NAME.findall(target["expr"]))
    assert len(read) >= 15
    missing = {
        name
        for name in read
        if name not in exposed
        and not any(name.endswith(s) and name.removesuffix(s) in exposed for s in _SUFFIXES)
    }
    assert not missing, f"read but not exported: {sorted(missing)}"
    assert len({panel["id"] for panel in panels}) == len(panels)


async def test_prometheus_scraping_the_proxy_counts_exactly_the_tokens_sent(
    proxy: RunningProxy, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    prometheus = _needs("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    target = proxy.root_url.removeprefix("http://")
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: art-proxy\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    process = await asyncio.create_subprocess_exec(
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        prompt = completion = 0
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
            for n in range(3):
                answer = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"count me {n}"}]
                )
                assert answer.usage is not None
                prompt += answer.usage.prompt_tokens
                completion += answer.usage.completion_tokens
        assert prompt > 0 and completion > 0
        queries = ["sum(art_proxy_prompt_tokens_total)", "sum(art_proxy_completion_tokens_total)"]
        assert await _read_until(http, port, queries, (prompt, completion)) == (prompt, completion)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


async def _read_until(
    http: aiohttp.ClientSession, port: int, queries: list[str], expected: tuple[int, int]
) -> tuple[int, ...]:
    """What Prometheus answers to `queries`, once it equals `expected` or after 60 s."""
    deadline = time.monotonic() + 60
    seen: tuple[int, ...] = ()
    while time.monotonic() < deadline:
        values = []
        for query in queries:
            try:
                async with http.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}
                ) as response:
                    result = (await response.json())["data"]["result"]
            except (aiohttp.ClientError, KeyError, ValueError):
                result = []
            values.append(int(float(result[0]["value"][1])) if result else -1)
        seen = tuple(values)
        if seen == expected:
            return seen
        await asyncio.sleep(0.5)
    return seen
