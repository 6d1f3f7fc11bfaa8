"""examples/online_learning/simulate.py as a user runs it, in a reduced form: two rounds of a few
users on the bundled SmolLM2 (CPU), every service its own process.

The tiny random model of the trainer tests cannot stand in here: it never ends an answer, so every
answer scores 0 and no group would carry the reward spread a trainer step needs. SmolLM2 answers the
train questions in a few words about one time in seven (measured: 35 of 256 samples scored above 0),
so a group of 8 has no spread about a third of the time, and two rounds of 4 such groups missed
a step's three now and then. Groups of 16 (15 shadow samples) from 6 users a round make it rare:
14 of 16 measured groups of 16 had a spread, so fewer than 3 of 12 is about 1 in 10^6.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from art_proxy.store.trajectory_store import TrajectoryStore
from examples.online_learning.stack import CANDIDATE_ALIAS, PROD_ALIAS, RUN

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples/online_learning/simulate.py"
USERS = 6
SHADOW_SAMPLES = 15
# About one step a round: a step costs far more than a round's answers on a CPU.
GROUPS_PER_STEP = 3
# Start-up (two model loads) and two rounds with a trainer step each, on a busy 2-core machine.
TIMEOUT_S = 900
# The simulation runs once for the module (`run`): its tests share one xdist worker.
pytestmark = pytest.mark.xdist_group("online_learning")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("online-learning")


@pytest.fixture(scope="module")
def run(workdir: Path) -> tuple[int, str]:
    """The script's exit status and everything it printed (it runs once for the module)."""
    argv = [sys.executable, str(SCRIPT), "--rounds", "2", "--users", str(USERS)]
    argv += ["--shadow-samples", str(SHADOW_SAMPLES), "--val-samples", "2"]
    argv += ["--groups-per-step", str(GROUPS_PER_STEP), "--workdir", str(workdir)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.terminate()  # as Ctrl-C would: the script stops its services before it exits
        output, _ = process.communicate()
    return process.returncode, output.decode(errors="replace")


@pytest.fixture
async def store(workdir: Path) -> AsyncIterator[TrajectoryStore]:
    async with TrajectoryStore.opened(f"sqlite:///{workdir / 'art.db'}", writer=False) as opened:
        yield opened


async def test_the_simulation_exits_0_after_a_summary_of_the_alias_moves(
    run: tuple[int, str],
) -> None:
    status, output = run
    assert status == 0, output
    assert f"2 rounds: {2 * USERS} prod calls" in output
    assert f"moves of the production alias {PROD_ALIAS!r}" in output
    moves = output.split(f"moves of the production alias {PROD_ALIAS!r}", 1)[1]
    assert "manual   - -> SmolLM2-135M-Instruct" in moves  # pointed at the base model at start
    assert [line for line in output.splitlines() if line.startswith("stopped ")] == [
        "stopped trainer",
        "stopped proxy",
        "stopped local-llm",
    ]


async def test_each_prod_group_holds_the_served_answer_and_its_rated_shadow_samples(
    run: tuple[int, str], store: TrajectoryStore
) -> None:
    prod = await store.trajectories(split="prod", limit=1000)
    groups: dict[str, list[str]] = {}
    for trajectory in prod:
        groups.setdefault(trajectory.group_id, []).append(trajectory.finish_reason or "open")
    assert len(groups) == 2 * USERS, run[1]
    for reasons in groups.values():
        assert sorted(reasons) == ["client"] + ["shadow"] * SHADOW_SAMPLES
    assert all(t.reward is not None for t in prod)
    served = {t.id for t in prod if t.finish_reason == "client"}
    shadows = [t for t in prod if t.finish_reason == "shadow"]
    assert {t.metadata["shadow_of"] for t in shadows} <= served  # kept through the rater's finish


async def test_every_served_answer_got_its_users_feedback_as_its_reward(
    run: tuple[int, str], store: TrajectoryStore
) -> None:
    prod = await store.trajectories(split="prod", limit=1000)
    served = [t for t in prod if t.finish_reason == "client"]
    feedback = await store.feedback([t.id for t in served])
    for trajectory in served:
        [given] = feedback[trajectory.id]
        assert given.score == trajectory.reward
        assert given.thumbs == ("up" if given.score == 1.0 else "down")


async def test_the_sidecar_trained_the_candidate_and_validation_ran_against_it(
    run: tuple[int, str], store: TrajectoryStore
) -> None:
    steps = await store.training_steps(RUN)
    assert any(step.status == "applied" for step in steps), run[1]
    val = await store.trajectories(split="val", limit=1000)
    assert len(val) == 2 * 4 * 2  # two rounds of the four val questions, two answers each
    calls = await store.calls([t.id for t in val])
    asked = {c.request["model"] for recorded in calls.values() for c in recorded}
    assert asked == {CANDIDATE_ALIAS}
