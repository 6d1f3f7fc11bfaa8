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
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import openai
import pytest
import typer.core
import typer.main
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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
        name: {volume.removesuffix(":ro") for volume in service.get("volumes", [])}
        for name, service in compose["services"].items()
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
    assert "SUCCESS: 8 rules found" in checked.stdout


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


# What the shipped deployment must be on its own, without an operator's edits: closed, hardened,
# its model found, its journal kept, its alerts able to fire.

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CHECKOV_CONFIG = ROOT / "deploy" / "checkov.yaml"
SCRAPE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
OPERATIONS = ROOT / "docs" / "operations.md"
DOWNLOAD = "huggingface_hub.snapshot_download(os.environ['MODEL'])"


def _documents() -> list[dict[str, Any]]:
    return [d for manifest in MANIFESTS for d in yaml.safe_load_all(manifest.read_text()) if d]


def _workload(name: str) -> dict[str, Any]:
    [found] = [
        d
        for d in _documents()
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name
    ]
    return found


def _pod(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = _workload(name)["spec"]["template"]["spec"]
    return pod


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<secret>") for e in container.get("env", [])}


def _expand(argument: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) in a container's arguments."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], argument)


def _flag(container: dict[str, Any], flag: str) -> str:
    env = _env(container)
    [value] = [
        _expand(a.split("=", 1)[1], env) for a in container["args"] if a.startswith(f"{flag}=")
    ]
    return value


def test_the_trainer_and_vllm_read_one_model_volume_filled_before_them() -> None:
    """The trainer reads its base model from the local Hugging Face cache only: each file gives
    it and vLLM one cache (HF_HOME) on a volume, filled by a download step before either starts,
    and both read it offline (a restart downloads nothing)."""
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    download = services["model"]
    assert DOWNLOAD in " ".join(download["entrypoint"])
    assert download["environment"]["HF_HOME"] == "/models"
    assert "models:/models" in download["volumes"]
    for name in ("vllm", "trainer"):
        service = services[name]
        assert service["environment"]["HF_HOME"] == "/models"
        assert service["environment"]["HF_HUB_OFFLINE"] == "1"
        assert "models:/models:ro" in service["volumes"]
        assert service["depends_on"]["model"] == {"condition": "service_completed_successfully"}
    models = set()
    for name in ("art-proxy-vllm", "art-proxy-trainer"):
        pod = _pod(name)
        [main] = pod["containers"]
        [init] = pod["initContainers"]
        assert DOWNLOAD in " ".join(init["command"])
        assert _env(init)["HF_HOME"] == _env(main)["HF_HOME"] == "/models"
        assert _env(main)["HF_HUB_OFFLINE"] == "1"
        models |= {_env(init)["MODEL"], _flag(main, "--model")}
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}  # fmt: skip
        assert claims["models"] == "art-proxy-models"
        for container in (init, main):
            assert "/models" in {m["mountPath"] for m in container["volumeMounts"]}
    assert len(models) == 1, f"the pods name different models: {models}"


def test_a_trainer_whose_model_is_not_in_the_cache_says_how_to_get_it(tmp_path: Path) -> None:
    """The model volume empty (a download step turned off, or failed): one line naming the fix,
    not a traceback and not a download."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "art-proxy"), "train", "--model", "someorg/not-here",
         "--store", f"sqlite:///{tmp_path / 'art.db'}", "--out", str(tmp_path / "out"),
         "--upstream", "http://127.0.0.1:9/v1"],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
             "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode != 0
    said = (done.stdout + done.stderr).strip()
    assert "Traceback" not in said
    assert "someorg/not-here" in said and "hf download someorg/not-here" in said, said


def test_each_proxy_pod_keeps_its_journal_on_a_claim_that_outlives_it() -> None:
    proxy = _workload("art-proxy")
    assert proxy["kind"] == "StatefulSet"
    [claim] = [
        c for c in proxy["spec"]["volumeClaimTemplates"] if c["metadata"]["name"] == "journal"
    ]
    pod = _pod("art-proxy")
    assert "journal" not in {v["name"] for v in pod.get("volumes", [])}  # no emptyDir
    [container] = pod["containers"]
    assert {"name": "journal", "mountPath": "/journal"} in container["volumeMounts"]
    assert _flag(container, "--journal") == "/journal"
    size = claim["spec"]["resources"]["requests"]["storage"]
    assert size.endswith("Gi")
    assert int(_flag(container, "--journal-max-mb")) < int(size.removesuffix("Gi")) * 1024
    # The preStop pause and the drain inside the grace period.
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = int(_flag(container, "--drain-timeout"))
    assert pause >= 5
    assert pause + drain + 5 <= pod["terminationGracePeriodSeconds"]
    compose = yaml.safe_load(COMPOSE.read_text())["services"]["proxy"]
    grace = int(compose["stop_grace_period"].removesuffix("s"))
    assert (
        int(next(a for a in compose["command"] if a.startswith("--drain-timeout=")).split("=")[1])
        < grace
    )


def test_a_rolling_update_keeps_proxies_answering() -> None:
    [container] = _pod("art-proxy")["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    [budget] = [d for d in _documents() if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "art-proxy"}
    assert budget["spec"]["maxUnavailable"] == 1 < _workload("art-proxy")["spec"]["replicas"]


def _relabel_keeps(job: dict[str, Any], label: str, value: str) -> bool:
    """Whether `job`'s keep rules on `label` keep a target whose label is `value`."""
    rules = [r for r in job["relabel_configs"] if r.get("action") == "keep"
             and r["source_labels"] == [label]]  # fmt: skip
    return bool(rules) and all(re.fullmatch(r["regex"], value) for r in rules)


def test_every_alert_reads_a_job_the_scrape_config_finds_in_the_manifests() -> None:
    """An alert on up{job="X"} fires only if Prometheus scrapes a job X, and a job scrapes only
    the pods its relabelling keeps: each job an alert names is in the shipped scrape
    configuration and keeps a workload's pods at a port that workload declares."""
    scrape = yaml.safe_load(SCRAPE.read_text())
    assert scrape["rule_files"] == [ALERTS.name]
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    named = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))
    assert named == {"art-proxy", "art-proxy-trainer"}
    assert named <= set(jobs)
    for name, job in jobs.items():
        kept = [
            d for d in _documents()
            if d["kind"] in ("Deployment", "StatefulSet") and _relabel_keeps(
                job, "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"])
        ]  # fmt: skip
        assert len(kept) == 1, f"job {name} keeps {len(kept)} workloads"
        ports = [
            port["name"]
            for container in kept[0]["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
            if _relabel_keeps(job, "__meta_kubernetes_pod_container_port_name", port["name"])
        ]
        assert len(ports) == 1, f"job {name} keeps ports {ports}"
    # The trainer serves what the job scrapes; nothing reads prometheus.io annotations.
    [trainer] = _pod("art-proxy-trainer")["containers"]
    [port] = trainer["ports"]
    assert int(_flag(trainer, "--metrics-port")) == port["containerPort"]
    assert "prometheus.io" not in "".join(m.read_text() for m in MANIFESTS)
    # An alias served by another model than its target (vLLM lost its adapters) alerts.
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert any("art_proxy_alias_fallback" in rule["expr"] for rule in rules)


def test_the_trainer_serves_its_step_figures_for_prometheus(tmp_path: Path) -> None:
    import urllib.request

    from art_proxy.config import TrainSettings

    port = free_port()
    settings = TrainSettings(out=str(tmp_path), metrics_port=port)
    step = TrainingStep(
        run="r", step=3, status="applied", metrics={"reward_mean": 0.25}, groups={},
        created_at=datetime.now(UTC),
    )  # fmt: skip
    with MetricsSink(tmp_path, settings) as sink:
        sink.write(step)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            served = response.read().decode()
    assert 'art_proxy_trainer_step{run="r"} 3.0' in served
    assert 'art_proxy_trainer_step_reward_mean{run="r"} 0.25' in served
    with pytest.raises(OSError):  # the port is let go with the sink
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_no_secret_ships_in_the_files_and_each_is_documented() -> None:
    """Secrets are the operator's: no Secret with a value in the manifests (re-applying one
    would reset a real secret to it), compose refuses to start without them, and no password
    is on a command line (any user of the host reads those)."""
    text = COMPOSE.read_text() + "".join(m.read_text() for m in MANIFESTS)
    assert "change-me" not in text
    assert not [d for d in _documents() if d["kind"] == "Secret"]
    compose = yaml.safe_load(COMPOSE.read_text())
    assert compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    for name, service in compose["services"].items():
        command = " ".join(service.get("command", []) + service.get("entrypoint", []))
        assert "PASSWORD" not in command and "postgresql://" not in command, name
    referenced = {
        (env["valueFrom"]["secretKeyRef"]["name"], env["valueFrom"]["secretKeyRef"]["key"])
        for d in _documents() if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
        for env in c.get("env", []) if "secretKeyRef" in env.get("valueFrom", {})
    }  # fmt: skip
    assert len(referenced) == 4
    operations = OPERATIONS.read_text()
    for secret, key in referenced:
        assert f"kubectl create secret generic {secret}" in operations, secret
        assert key in operations


def test_no_image_is_latest_and_ours_carry_the_projects_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    images = [
        c["image"]
        for d in _documents() if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
        + d["spec"]["template"]["spec"].get("initContainers", [])
    ] + [s["image"] for s in yaml.safe_load(COMPOSE.read_text())["services"].values()]  # fmt: skip
    for image in images:
        name, _, tag = image.rpartition(":")
        assert tag and tag != "latest" and "/" not in tag, image
        if name.startswith("art-proxy"):
            assert tag == version, image


def test_the_image_installs_every_dependency_at_a_pinned_version() -> None:
    """deploy/constraints.txt pins every package the images install (scripts/image_constraints.py)
    at a version pyproject.toml allows, and both of the Containerfile's installs use it."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    trainer = tomllib.loads((ROOT / "trainer" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [*project["dependencies"], *trainer["dependencies"],
              *(r for e in ("pii", "export", "local", "trackers") for r in extras[e])]  # fmt: skip
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name in ("art-proxy", "torch") or not (
            requirement.marker is None or requirement.marker.evaluate()
        ):
            continue
        assert name in pins, f"{name} is not pinned in {CONSTRAINTS.name}"
        assert pins[name] in requirement.specifier, f"{name}=={pins[name]} outside {requirement}"
    installs = [line for line in CONTAINERFILE.read_text().splitlines() if "pip install" in line
                and "--no-deps" not in line and "torch==" not in line]  # fmt: skip
    assert len(installs) == 2
    assert all("--constraint constraints.txt" in line for line in installs)


def test_network_policies_let_only_who_needs_it_reach_each_port() -> None:
    policies = {d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]: d["spec"]
                for d in _documents() if d["kind"] == "NetworkPolicy"}  # fmt: skip
    workloads = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
                 for d in _documents() if d["kind"] in ("Deployment", "StatefulSet")}  # fmt: skip
    assert set(policies) == workloads

    def callers(name: str) -> set[str]:
        [rule] = policies[name]["ingress"]
        return {
            peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in rule["from"]
        }

    assert callers("art-proxy-postgres") == {"art-proxy", "art-proxy-judge", "art-proxy-trainer"}
    assert callers("art-proxy-vllm") == {"art-proxy", "art-proxy-trainer"}
    assert "ingress" not in policies["art-proxy-judge"]


def test_checkov_passes_the_manifests_and_the_containerfile(tmp_path: Path) -> None:
    """checkov (its own environment, .venv-checkov: `make test` makes it) on deploy/ and the
    Containerfile, offline, with the checks deploy/checkov.yaml skips, each with its reason."""
    if not CHECKOV.exists():
        pytest.skip("checkov is not installed: `make .venv-checkov/.installed` installs it")
    # checkov knows a Dockerfile by its name only.
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    shutil.copy(CONTAINERFILE, tmp_path / "deploy" / "Dockerfile")
    done = subprocess.run(
        [str(CHECKOV), "--directory", str(tmp_path / "deploy"), "--config-file", str(CHECKOV_CONFIG),
         "--output", "json", "--skip-download"],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BC_SKIP_MAPPING": "TRUE"},
    )  # fmt: skip
    reports = json.loads(done.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == {"kubernetes", "dockerfile"}
    failed = [
        f"{c['check_id']} {c['resource']}" for r in reports for c in r["results"]["failed_checks"]
    ]
    assert not failed, failed
    assert sum(r["summary"]["passed"] for r in reports) >= 400
    # Each skip names its reason: a comment above it in the config, a text in an annotation.
    config = CHECKOV_CONFIG.read_text().splitlines()
    for n, line in enumerate(config):
        if line.strip().startswith("- CKV"):
            assert config[n - 1].strip().startswith("#"), line
    for d in _documents():
        for key, value in d["metadata"].get("annotations", {}).items():
            if key.startswith("checkov.io/skip"):
                assert re.fullmatch(r"CKV\w+=.{20,}", value), value


def test_every_service_running_an_image_of_ours_builds_it() -> None:
    """No registry publishes art-proxy's images: a service that names one without building it
    makes compose pull it, and fail."""
    for name, service in yaml.safe_load(COMPOSE.read_text())["services"].items():
        image = service["image"].split(":")[0]
        if image in ("art-proxy", "art-proxy-trainer"):
            expected = "trainer" if image == "art-proxy-trainer" else "proxy"
            assert service["build"]["target"] == expected, name
