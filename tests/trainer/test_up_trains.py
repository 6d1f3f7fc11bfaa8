"""`art-proxy up --agent --scenarios`: the embedded stack runs the whole training loop, then stops."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_up import art_proxy_up
from tests.trainer.test_training_loop import AGENT, SCENARIOS

# Starting two servers and a trainer, then two steps of a tiny model, on a busy 2-core machine.
TRAIN_TIMEOUT_S = 300.0


async def test_up_with_an_agent_trains_it_and_stops_the_stack_when_training_ends(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    flags = ("--model", str(tiny_model_dir), "--agent", AGENT, "--scenarios", SCENARIOS)
    async with art_proxy_up(
        tmp_path, *flags, "--steps", "2", "--out", str(tmp_path / "train")
    ) as up:
        status = await up.wait(TRAIN_TIMEOUT_S)

    output = up.output()
    assert status == 0, output
    assert "reached --steps 2" in output
    assert "HTTP Request" not in output  # the agent's SDK (httpx, httpx2) does not log each call
    # The trainer's summary, then one line of counts: no trajectory table pushes it away.
    assert "recorded trajectories" not in output
    assert output.index("calls recorded,") > output.index("reached --steps 2")
    # Then the base model against the trained adapter on the val scenarios (art-proxy eval).
    assert output.index("vs base") > output.index("reached --steps 2")
    report = json.loads((tmp_path / "train" / "eval" / "report.json").read_text())
    assert [arm["label"] for arm in report["arms"]] == ["base", "trained"]
    base, trained = (arm["model"] for arm in report["arms"])
    # The base under the trainer's alias (named after the base), and the adapter it serves.
    alias = base.removesuffix("@0")
    assert base == f"{alias}@0" and trained.startswith(f"{alias}@2-")
    assert len((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()) == 2
    up.assert_nothing_left_running()
