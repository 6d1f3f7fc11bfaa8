"""`proxy_overhead.py`'s targets: the workload, what each target's run yields, and the servers
(the fake vLLM, the bare relay, art-proxy, LiteLLM in its own venv) started as subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.markup import escape

from art_proxy.testing.loopback import free_port

REPO = Path(__file__).resolve().parents[1]
LITELLM_VENV = REPO / ".venv-litellm"
# Pinned so runs compare; the newest release whose dependencies resolve on the package index here.
LITELLM_VERSION = "1.106.2"
HOST = "127.0.0.1"
CONCURRENCY = (16, 64)
# Opens the connections and warms each server's caches before anything is timed.
WARMUP_REQUESTS = 50
WARMUP_STREAMS = 5
# A slow target (LiteLLM) ends a phase here rather than at its request count.
PHASE_DEADLINE_S = 15.0
# The throughput phases take turns, target after target, this many times at each level, and each
# target's best round counts: the machine's speed drifts within a run (other tenants' load), and
# taking turns lets every target meet the same drift instead of one target a slow minute.
THROUGHPUT_ROUNDS = 3
# How often a throughput round of art-proxy asks whether its records are in the store yet.
INGESTED_POLL_S = 0.005
# Sequential latency is measured in this many blocks per target, the targets taking turns.
LATENCY_ROUNDS = 5
# LiteLLM imports for a long while on 2 busy cores; the others are up in about a second.
START_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 30.0
PIP_TIMEOUT_S = 900.0

# The targets.
MAX_ADDED_P50_MS = 0.8
MIN_THROUGHPUT_VS_LITELLM = 20.0
MIN_THROUGHPUT_VS_DIRECT = 0.25
MIN_STREAMED_VS_DIRECT = 0.5
TARGET_CONCURRENCY = 16
# The streaming relay's phase: this many streams at once, each of this many chunks (one token each).
STREAM_CONCURRENCY = 64
STREAM_CHUNKS = 256
# Long enough for STREAM_CHUNKS tokens; other calls are cut at CALL_MAX_TOKENS.
FAKE_REPLY = "Hello from the fake." + " word" * STREAM_CHUNKS
CALL_MAX_TOKENS = 16
# The floor beside art-proxy: an aiohttp relay that passes bytes and does nothing else.
BARE_RELAY = "bare relay"

LITELLM_ENV = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches the cost map from GitHub at import
    "DISABLE_SCHEMA_UPDATE": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    "HF_HUB_OFFLINE": "1",
    "NO_DOCS": "True",
}
# Would make LiteLLM open a database, or call something beyond the fake.
LITELLM_ENV_DROPPED = ("DATABASE_URL", "REDIS_HOST", "REDIS_URL", "LITELLM_MASTER_KEY")

# Wide enough for the report when the output goes to a file or CI log (rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


@dataclass(frozen=True)
class Workload:
    model: str
    # LiteLLM refuses to start without a strong master key; every target is sent the same header.
    api_key: str
    requests: int  # sequential calls per target; 4x per concurrency level, 1/2x streams
    relayed_streams: int  # streams of STREAM_CHUNKS chunks in the streaming relay phase


class TargetUnavailable(Exception):
    """A target could not be installed or started, or answered no call of a phase."""


class CallFailed(Exception):
    """A call answered with an error status or an incomplete body."""


# ---------------------------------------------------------------- results


@dataclass
class TargetResult:
    name: str
    latencies_ms: list[float] = field(default_factory=list)  # sequential calls
    throughput: dict[int, float] = field(default_factory=dict)  # concurrency -> best round's req/s
    ttfb_ms: list[float] = field(default_factory=list)
    chunks_per_s: float = 0.0  # the streaming relay phase
    failed_calls: int = 0
    # The target's process (all its threads) over its rounds at TARGET_CONCURRENCY, where
    # /proc tells; the fake's and the load generator's CPU are not in it.
    cpu_us_per_call: float | None = None

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p90_ms(self) -> float:
        return percentile(self.latencies_ms, 90)

    @property
    def ttfb_p50_ms(self) -> float:
        return percentile(self.ttfb_ms, 50)


@dataclass
class Report:
    results: dict[str, TargetResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # target -> why
    proxy_health: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# ---------------------------------------------------------------- servers


class Servers:
    """The run's subprocesses, each in its own session so that stopping it stops its children."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with self.log_path(name).open("wb") as log:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._workdir,
                start_new_session=True,
            )

    def log_path(self, name: str) -> Path:
        return self._workdir / f"{name.replace(' ', '-')}.log"

    def exit_code(self, name: str) -> int | None:
        return self._procs[name].poll()

    def cpu_seconds(self, name: str) -> float | None:
        """CPU time the server's process has used so far (user and system, all threads);
        None where /proc does not tell (not Linux)."""
        try:
            stat = Path(f"/proc/{self._procs[name].pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, name: str, lines: int = 8) -> str:
        text = self.log_path(name).read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])

    def stop_all(self) -> None:
        for proc in reversed(self._procs.values()):
            _signal_group(proc, signal.SIGTERM)
        for proc in reversed(self._procs.values()):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def litellm_config(workload: Workload, upstream: str) -> dict[str, Any]:
    model = workload.model
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": upstream,
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {
            "telemetry": False,
            "drop_params": True,
            "num_retries": 0,
            "request_timeout": CALL_TIMEOUT_S,
            "turn_off_message_logging": True,
        },
        "general_settings": {"master_key": workload.api_key, "disable_spend_logs": True},
    }


def ensure_litellm() -> Path:
    """The `litellm` command of `.venv-litellm`, installing it there first if needed."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        console.print(f"creating {LITELLM_VENV} (LiteLLM stays out of .venv) ...")
        _run_setup([sys.executable, "-m", "venv", str(LITELLM_VENV)])
    if _installed_litellm(python) != LITELLM_VERSION:
        console.print(
            escape(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.name} ..."),
        )
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run_setup([*pip, f"litellm[proxy]=={LITELLM_VERSION}"])
    return LITELLM_VENV / "bin" / "litellm"


def _installed_litellm(python: Path) -> str | None:
    script = "import importlib.metadata as m; print(m.version('litellm'))"
    found = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def _run_setup(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        # pip's "(from versions: ...)" lists every release; the rest of its ERROR lines is the why.
        errors = [
            line.split(" (from versions:")[0] for line in exc.stderr.splitlines() if "ERROR" in line
        ]
        why = " ".join(errors[-2:]) or exc.stderr.strip()[-300:]
        raise TargetUnavailable(f"`{' '.join(argv[:4])} ...` failed: {why}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TargetUnavailable(
            f"`{' '.join(argv[:4])} ...` took over {PIP_TIMEOUT_S:.0f} s"
        ) from exc


def start_servers(
    servers: Servers, workdir: Path, workload: Workload, litellm: Path | None
) -> dict[str, str]:
    """Start every server at once (they boot in parallel); returns each target's base URL."""
    ports = {name: free_port() for name in ("direct", BARE_RELAY, "art-proxy", "LiteLLM")}
    urls = {name: f"http://{HOST}:{port}/v1" for name, port in ports.items()}
    fake = urls["direct"]
    fake_vllm = [
        *[sys.executable, "-m", "art_proxy.testing.fake_vllm", "--model", workload.model],
        *["--reply", FAKE_REPLY],
    ]
    servers.start("direct", [*fake_vllm, *_bind(ports["direct"])])
    bare_relay = [sys.executable, str(Path(__file__).with_name("bare_relay.py"))]
    servers.start(BARE_RELAY, [*bare_relay, *_bind(ports[BARE_RELAY]), "--upstream", fake])
    store = f"sqlite:///{workdir / 'art.db'}"
    art_proxy = Path(sys.executable).with_name("art-proxy")
    servers.start(
        "art-proxy",
        [str(art_proxy), "serve", *_bind(ports["art-proxy"]), "--upstream", fake, "--store", store],
    )
    if litellm is None:
        del urls["LiteLLM"]
        return urls
    config = workdir / "litellm.yaml"
    config.write_text(json.dumps(litellm_config(workload, fake)))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k not in LITELLM_ENV_DROPPED}
    servers.start(
        "LiteLLM",
        [str(litellm), "--config", str(config), *_bind(ports["LiteLLM"]), "--num_workers", "1"],
        env=env | LITELLM_ENV,
    )
    return urls


def _bind(port: int) -> list[str]:
    return ["--host", HOST, "--port", str(port)]


def health_url(name: str, base_url: str) -> str:
    root = base_url.removesuffix("/v1")
    # LiteLLM's /health calls every model; liveliness only says the server is up.
    return root + ("/health/liveliness" if name == "LiteLLM" else "/health")


async def wait_ready(session: aiohttp.ClientSession, servers: Servers, name: str, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        code = servers.exit_code(name)
        if code is not None:
            raise TargetUnavailable(f"exited with code {code}:\n{servers.log_tail(name)}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise TargetUnavailable(f"not ready after {START_TIMEOUT_S:.0f} s:\n{servers.log_tail(name)}")
