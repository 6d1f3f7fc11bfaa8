"""The docs site's generated page is current: docs/cli.md is what docs/gen_cli.py renders now."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

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
