"""Best-of-N's groups train: the ranking that chose a user's answer is a step's reward.

A tiny random model behind local-llm, the proxy answering best-of-4 with a check written to a file,
and the sidecar trainer reading the store as it does for production traffic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from rich.console import Console

from art_proxy.config import TrainSettings
from art_proxy.local.model_loading import load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import running_local_llm
from art_proxy.proxy.server import running_proxy
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.command import run_train
from tests.conftest import proxy_settings
from tests.trainer.conftest import TINY_NAME, Stack

# The shorter the answer, the better (a random model's answers differ in length).
CHECK = """
def shorter(messages, choice):
    return 1.0 / (1.0 + len(choice["message"]["content"] or ""))
"""


@pytest.fixture
async def best_of_stack(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    (tmp_path / "checks.py").write_text(CHECK)
    served = ServedModel.create(load_model(str(tiny_model_dir)), served_model_name=TINY_NAME)
    store_url = f"sqlite:///{tmp_path / 'art.db'}"
    async with running_local_llm(served) as llm:
        settings = proxy_settings(
            store_url, llm.base_url, best_of_check=f"{tmp_path / 'checks.py'}:shorter"
        )
        async with running_proxy(settings) as proxy:
            yield Stack(llm, proxy, store_url, tiny_model_dir)


async def test_the_sidecar_trains_on_the_groups_best_of_judged(
    best_of_stack: Stack, tmp_path: Path
) -> None:
    stack = best_of_stack
    async with AsyncOpenAI(
        base_url=stack.proxy.base_url, api_key="unused", default_headers={"X-Art-Best-Of": "4"}
    ) as client:
        for question in ("Name a fruit.", "Name a colour."):
            await client.chat.completions.create(
                model=TINY_NAME,
                messages=[{"role": "user", "content": question}],
                max_tokens=8,
                temperature=1.0,
            )
    await stack.proxy.parts.settled()
    settings = TrainSettings.model_validate(
        {
            "store": stack.store_url,
            "upstream": [stack.llm.base_url],
            "model": str(stack.model_dir),
            "out": str(tmp_path / "run"),
            "steps": 1,
            "groups_per_step": 2,
            "val_every": 0,
            "swap": False,
            "poll": 0.2,
        }
    )
    summary = await run_train(settings, Console(quiet=True))

    assert summary.stopped == "reached --steps 1"
    async with TrajectoryStore.opened(stack.store_url, writer=False) as store:
        (step,) = await store.training_steps(run="run")
        judged = {j.group_id for j in await store.judgments()}
    assert step.status == "applied"
    assert set(step.groups) == judged and len(judged) == 2
    assert set(step.groups.values()) == {"trained"}
    assert step.metrics["tokens"] > 0
