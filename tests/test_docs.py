"""The docs: docs/cli.md is what docs/gen_cli.py renders now; the own-agent steps run as written."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_from_the_app() -> None:
    rendered: str = load_generator().render()
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert rendered == committed, (
        "docs/cli.md is out of date: run `.venv/bin/python docs/gen_cli.py` to refresh it"
    )


def test_every_command_has_its_section() -> None:
    committed = (ROOT / "docs" / "cli.md").read_text()
    for command in ("serve", "up", "local-llm", "judge", "train", "rollout", "export"):
        assert f"### art-proxy {command}\n" in committed


def own_agent_block(page: str) -> str:
    """The shell block under "Train your own agent" on `page`."""
    section = page.split("## Train your own agent", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
@pytest.mark.parametrize("check", ["fails", "passes"])
def test_the_own_agent_steps_run_through_in_one_shell(
    page: str, check: str, tmp_path: Path
) -> None:
    """Pasted into one shell as written (the servers of step 1 in the background), the steps end:
    stand-ins for art-proxy (its servers run until killed; `judge --check` exits 1 as the bundled
    judge's does, or 0) and the agent (a moment's work). Followed verbatim, it never trains on
    the scores of a judge whose check failed."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    checked = 1 if check == "fails" else 0
    stand_ins = {
        "art-proxy": 'case "$1" in local-llm|serve) exec sleep 600;; esac\necho "$@" >> calls\n'
        f'case "$1 $2" in "judge --check") exit {checked};; esac\n',
        "python": 'sleep 0.2\necho "$@" >> calls\n',
        "curl": "exit 0\n",  # the servers answer
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    script = "sleep() { :; }\n" + own_agent_block((ROOT / page).read_text())
    path = f"{bin_dir}:{os.environ['PATH']}"  # the stand-in curl
    process = subprocess.Popen(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        start_new_session=True,
        env={**os.environ, "PATH": path},
    )
    try:
        status = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        status = None
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the stand-in servers
    assert status == 0, "the steps did not end (a bare `wait` waits for the servers too)"
    calls = (tmp_path / "calls").read_text().splitlines()
    assert sum(call.startswith("my_agent.py") for call in calls) == 8
    assert calls[-1] == "alias list --store sqlite:///mine.db"
    [train] = [call for call in calls if call.startswith("train ")]
    judged = any(call.startswith("judge ") and "--check" not in call for call in calls)
    assert judged and any(call.startswith("judge --check") for call in calls)
    if check == "fails":  # the judge's scores untouched: the model teaches itself
        assert "--reward-source teacher" in train and "--teacher-context hint.txt" in train
        assert (tmp_path / "hint.txt").read_text().strip()
    else:
        assert "--reward-source" not in train and "--teacher" not in train
