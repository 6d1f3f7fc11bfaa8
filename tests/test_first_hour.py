"""The walls a new user met after `make demo`, each as the user met it.

An alias the demo moved to an adapter the fresh upstream lacks answered every call with "model does
not exist"; aliases could be reset only with a raw PUT; a base URL without /v1 started silently;
`up` started beside servers that already held its ports; a missing torch was a traceback; there was
no `--version`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from art_proxy.config import UpSettings
from art_proxy.errors import ConfigError
from art_proxy.proxy import upstream_models
from art_proxy.proxy.server import running_proxy
from art_proxy.records import AliasRequest
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.up.plan import plan
from tests.conftest import proxy_settings
from tests.proxy_load import run_cli
from tests.wire_client import post

BASE = "Qwen/Qwen2.5-0.5B-Instruct"  # what the fake vLLM serves
ROOT = Path(__file__).resolve().parent.parent


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def set_alias(store_url: str, alias: str, model: str, step: int | None = None) -> None:
    async with TrajectoryStore.opened(store_url, writer=False) as store:
        await store.set_alias(alias, AliasRequest(model=model, step=step, reason="swap"))


async def test_an_alias_whose_adapter_is_gone_at_start_falls_back_to_the_base_model(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    # What `make demo` leaves: the alias on the demo's last adapter, which a fresh server lacks.
    await set_alias(sqlite_url, BASE, f"{BASE}@20", step=20)
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy:
        status, body = await post(http, f"{proxy.base_url}/chat/completions", chat(BASE))
        assert status == 200, body
        assert vllm.requests[-1]["model"] == BASE
        async with http.get(f"{proxy.root_url}/health") as response:
            health = await response.json()
        assert health["alias_fallbacks"] == {BASE: {"target": f"{BASE}@20", "served": BASE}}
    assert f"points at {BASE}@20, which an upstream does not serve" in caplog.text
    assert "art-proxy alias reset" in caplog.text


async def test_an_alias_on_another_name_falls_back_to_the_one_base_and_returns_when_loaded(
    sqlite_url: str,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_models, "WATCH_PERIOD_S", 0.05)
    await set_alias(sqlite_url, "email-agent", "email-agent@3", step=3)
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy:
        await post(http, f"{proxy.base_url}/chat/completions", chat("email-agent"))
        assert vllm.requests[-1]["model"] == BASE
        # Loaded again (a trainer's swap, or by hand): the watch sends calls to it again.
        status, _ = await post(
            http,
            f"{vllm.base_url}/load_lora_adapter",
            {"lora_name": "email-agent@3", "lora_path": str(tmp_path)},
        )
        assert status == 200
        for _ in range(100):
            if not proxy.parts.aliases.fallbacks:
                break
            await asyncio.sleep(0.05)
        await post(http, f"{proxy.base_url}/chat/completions", chat("email-agent"))
        assert vllm.requests[-1]["model"] == "email-agent@3"
        # Unloaded under it (another run sharing the upstream): back to the base, no 404s.
        await post(http, f"{vllm.base_url}/unload_lora_adapter", {"lora_name": "email-agent@3"})
        for _ in range(100):
            if proxy.parts.aliases.fallbacks:
                break
            await asyncio.sleep(0.05)
        status, _ = await post(http, f"{proxy.base_url}/chat/completions", chat("email-agent"))
        assert status == 200 and vllm.requests[-1]["model"] == BASE


async def test_an_upstream_url_without_v1_stops_the_proxy_with_the_fix(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    root = vllm.base_url.removesuffix("/v1")
    with pytest.raises(ConfigError, match=r"ends in /v1 \(--upstream .*/v1\)"):
        async with running_proxy(proxy_settings(sqlite_url, root)):
            pass


async def test_an_upstream_not_answering_yet_is_a_warning_not_a_stop(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    async with running_proxy(proxy_settings(sqlite_url, f"http://127.0.0.1:{port}/v1")):
        pass
    assert "does not answer yet" in caplog.text


async def test_alias_list_set_and_reset_from_the_command_line(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    await set_alias(sqlite_url, BASE, f"{BASE}@20", step=20)
    status, out, _ = await run_cli("alias", "list", "--store", sqlite_url)
    assert status == 0 and f"{BASE}@20" in out

    status, _, err = await run_cli(
        "alias", "reset", BASE, "--store", sqlite_url, "--upstream", vllm.base_url
    )
    assert status == 0, err
    assert f"now serves {BASE} (was {BASE}@20)" in " ".join(err.split())

    status, _, err = await run_cli(
        "alias", "set", "email-agent", "email-agent@2", "--step", "2", "--store", sqlite_url
    )
    assert status == 0, err
    async with TrajectoryStore.opened(sqlite_url, writer=False) as store:
        assert {r.alias: r.model for r in await store.aliases()} == {
            BASE: BASE,
            "email-agent": "email-agent@2",
        }
        assert [m.reason for m in await store.alias_moves()] == ["manual", "manual", "swap"]

    # No upstream to ask for the base: one line that says what to do instead.
    status, _, err = await run_cli(
        "alias",
        "reset",
        "email-agent",
        "--store",
        sqlite_url,
        "--upstream",
        "http://127.0.0.1:9/v1",
    )
    assert status == 1
    assert "art-proxy alias set email-agent MODEL" in " ".join(err.split())
    assert "Traceback" not in err


async def test_version() -> None:
    status, out, _ = await run_cli("--version")
    assert status == 0 and out.startswith("art-proxy ")


def test_up_refuses_ports_another_server_holds() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is taken.*--llm-port"):
            plan(UpSettings(llm_port=port, port=0))
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is taken.*--port"):
            plan(UpSettings(llm_port=0, port=port))


async def test_serve_and_local_llm_say_a_taken_port_before_anything_slow(
    tmp_path: Path,
) -> None:
    """`serve` took 9 s and `local-llm` 16 s (the model loaded first) to say that their port
    was taken. Said first now: before a model that is not there, or a store's missing folder."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        missing = str(tmp_path / "no-such-model")
        store = f"sqlite:///{tmp_path / 'no-such-folder' / 'art.db'}"
        for command in (
            ("local-llm", "--port", port, "--model", missing),
            ("serve", "--port", port, "--store", store, "--upstream", "http://127.0.0.1:9/v1"),
        ):
            status, _, err = await run_cli(*command)
            said = " ".join(err.split())
            assert status == 1 and f"port {port} on 127.0.0.1 is taken" in said, (command, err)
            assert f"ART_PROXY_PORT={int(port) + 1} art-proxy {command[0]}" in said
            assert "Traceback" not in err


def test_local_llm_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from art_proxy import local
    from art_proxy.cli import app

    monkeypatch.setattr(local, "LOCAL_PACKAGES", ("no_such_package_xyz",))
    result = CliRunner().invoke(app, ["local-llm"])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "needs no_such_package_xyz" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    with pytest.raises(ConfigError, match="art-proxy up needs no_such_package_xyz"):
        plan(UpSettings(llm_port=0, port=0))


def test_a_sidecar_with_nothing_to_train_on_says_how_to_feed_it() -> None:
    from art_proxy.config import TrainSettings
    from art_proxy_trainer.sidecar import waiting_line

    judged = waiting_line(TrainSettings(scenario=["inbox"]), 0, 0)
    assert "no group of scenario inbox to train on yet" in judged
    assert "art-proxy judge scores its groups" in judged
    finished = waiting_line(TrainSettings(reward_source="finish"), 0, 0)
    assert "POST .../finish" in finished
    assert "to train on yet" not in waiting_line(TrainSettings(), 1, 3)


def test_local_llm_keeps_library_notes_out_of_its_output(capfd: pytest.CaptureFixture[str]) -> None:
    import warnings

    from transformers.utils import logging as transformers_logging

    from art_proxy.local.cli import quiet_library_warnings

    verbosity = transformers_logging.get_verbosity()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_library_warnings()
            warnings.warn("`past_key_values` is deprecated", FutureWarning, stacklevel=1)
            warnings.warn(
                "Adapter lora3 was active which is now deleted. Setting ...", stacklevel=1
            )
            warnings.warn("a warning of art-proxy's own", UserWarning, stacklevel=1)
            transformers_logging.get_logger("transformers.utils.generic").warning(
                "`past_key_values`/`cache_params` are deprecated. Use `cache` instead."
            )
    finally:
        transformers_logging.set_verbosity(verbosity)
    assert [str(w.message) for w in caught] == ["a warning of art-proxy's own"]
    assert "cache_params" not in capfd.readouterr().err


def test_make_demo_says_a_port_is_taken_before_its_setup() -> None:
    """The port error once came after the 4-minute setup; it names the variable that moves it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["make", "-s", "demo-ports"],
            cwd=Path(__file__).parent.parent,
            env={**os.environ, "ART_PROXY_PORT": str(port), "ART_PROXY_LLM_PORT": "1"},
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    assert done.returncode != 0
    assert f"port {port} is taken" in done.stderr
    assert f"ART_PROXY_PORT={port + 1} make demo" in done.stderr


async def test_a_read_command_on_a_store_that_does_not_exist_refuses_and_makes_none(
    tmp_path: Path,
) -> None:
    """`alias list --store sqlite:///mien.db` said "no aliases" and left a new empty store
    behind: a misspelt store read as an empty one (and `forget` as a subject with no data)."""
    missing = tmp_path / "mien.db"
    url = f"sqlite:///{missing}"
    for command in (
        ("alias", "list"),
        ("export",),
        ("lineage", "--user", "jane"),
        ("forget", "--user", "jane", "--yes"),
        ("scenario-bank", "--out", str(tmp_path / "bank.jsonl")),
        ("judge", "--check", "--judge", "openai/any", "--judge-base-url", "http://127.0.0.1:9/v1"),
    ):
        status, _, err = await run_cli(*command, "--store", url)
        assert status == 1, (command, err)
        assert f"no store at {url}" in " ".join(err.split()), (command, err)
        assert "Traceback" not in err and not missing.exists(), command


async def test_a_store_a_newer_art_proxy_migrated_is_refused_in_one_line(tmp_path: Path) -> None:
    """An older art-proxy on a store a newer one had opened printed alembic's traceback ("Can't
    locate revision identified by '0024'") and stopped `make demo`'s evaluation."""
    import sqlite3

    from art_proxy.store.trajectory_store import TrajectoryStore

    store = tmp_path / "art.db"
    url = f"sqlite:///{store}"
    async with TrajectoryStore.opened(url, writer=False):
        pass
    with sqlite3.connect(store) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '9999'")
    for command in (("alias", "list"), ("alias", "history"), ("export",)):
        status, _, err = await run_cli(*command, "--store", url)
        said = " ".join(err.split())
        assert status == 1 and "written by a newer art-proxy" in said, (command, err)
        assert "upgrade art-proxy to open it" in said and "Traceback" not in err, command


def _make(recipe: str) -> subprocess.CompletedProcess[str]:
    """`make` running one recipe line with the Makefile's variables and shell."""
    return subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "--eval",
            f"check-unbury:\n\t{recipe}",
            "check-unbury",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_setup_drops_pips_missing_folder_warnings_and_keeps_its_errors_and_exit() -> None:
    """257 lines of pip's 'Location ... is ignored' buried `make demo`'s own output."""
    noise = "WARNING: Location 'file:///opt/pypi/simple/absl-py/' is ignored: it is neither a file nor a directory."
    said = "printf '%s\\n' \"$$NOISE\" 'WARNING: pip is old' 'ERROR: no matching distribution'"
    shown = _make(f'NOISE="{noise}"; {{ {said}; }} | $(UNBURY)')
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["WARNING: pip is old", "ERROR: no matching distribution"]
    assert _make('{ echo "$(NOISE)"; exit 3; } | $(UNBURY)').returncode != 0  # pip's failure stays
    joined = (ROOT / "Makefile").read_text().replace("\\\n", " ")  # continued lines as one
    recipes = [line for line in joined.splitlines() if "/pip " in line]
    assert len(recipes) >= 8 and all("$(UNBURY)" in r or "$(PROGRESS)" in r for r in recipes)


def test_the_long_installs_say_how_far_they_got_and_keep_pips_errors_and_exit() -> None:
    """`make demo`'s main install was 167 s without a line (pip --quiet)."""
    noise = "WARNING: Location 'file:///opt/pypi/simple/absl-py/' is ignored: it is neither a file nor a directory."
    pip = (
        "printf '%s\\n' 'Collecting aiohttp>=3.10' '  Using cached aiohttp-3.13.whl' \"$$NOISE\" "
        "'Collecting orjson' 'Requirement already satisfied: torch' 'ERROR: no matching distribution'"
    )
    shown = _make(f'NOISE="{noise}"; {{ {pip}; }} | $(PROGRESS) "the test\'s packages"')
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "setup: the test's packages..."
    assert lines[1] == "ERROR: no matching distribution"
    assert lines[2].startswith("setup: the test's packages: pip finished (2 packages collected, ")
    assert len(lines) == 3
    assert _make('{ echo Collecting x; exit 3; } | $(PROGRESS) "x"').returncode != 0
    joined = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    long = [
        line
        for line in joined.splitlines()
        if "-e '.[dev,local]'" in line or "-r requirements-vllm" in line
    ]
    assert len(long) == 2 and all("$(PROGRESS)" in line and "--quiet" not in line for line in long)


def test_a_silent_install_still_says_it_is_at_work_every_30_seconds() -> None:
    script = ROOT / "scripts" / "pip_progress.py"
    slow = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; import scripts.pip_progress as p; p.EVERY_S = 0.2; "
            "sys.argv = ['pip_progress.py', 'slow']; sys.exit(p.main())",
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert slow.stdin is not None
    slow.stdin.write("Collecting torch\n")
    slow.stdin.flush()
    time.sleep(1.0)
    out, _ = slow.communicate("")
    ticks = [line for line in out.splitlines() if "still at it" in line]
    assert ticks and "(1 packages collected, the latest torch)" in ticks[0], out
    assert script.is_file()
