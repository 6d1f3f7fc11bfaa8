"""The tool example's path, reduced: a stock LangGraph agent with a tool, recorded against a
stand-in for a hosted model (text, no token ids), a warm start on those recordings, then GRPO on
the agent's own rollouts, on the tiny model. What is asserted is the bookkeeping, not learning:
each rollout is one trajectory, the warm start learns the tool calls and answers and not the
prompts or tool results, and its steps are recorded and swapped in before a GRPO step follows."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from art_proxy.config import TrainSettings
from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import load_model
from art_proxy.proxy.server import running_proxy
from art_proxy.rollout import run_rollouts
from art_proxy.scenarios import load_scenarios
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.loopback import free_port
from art_proxy_trainer.command import run_train
from art_proxy_trainer.demonstrations import (
    StoreDemonstrations,
    demonstration_sequences,
    stored_demonstrations,
)
from examples.tool_lookup.agent import rollout
from examples.tool_lookup.codes import city_asked, code_word
from examples.tool_lookup.demonstrator import MODEL as DEMONSTRATOR
from examples.tool_lookup.demonstrator import running_demonstrator
from examples.tool_lookup.run import HERE, SCENARIOS
from tests.conftest import proxy_settings
from tests.trainer.agents import untagged
from tests.trainer.conftest import TINY_NAME, Stack

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


async def test_a_tool_agent_warm_starts_on_a_hosted_models_recordings_then_trains(
    stack: Stack, tmp_path: Path
) -> None:
    scenarios = load_scenarios(str(SCENARIOS))
    train = [s for s in scenarios if s.split == "train"][:4]
    async with (
        running_demonstrator(free_port()) as upstream,
        running_proxy(
            proxy_settings(stack.store_url, upstream, journal=str(tmp_path / "journal"))
        ) as hosted,
    ):
        report = await run_rollouts(
            rollout,
            train,
            proxy_url=hosted.root_url,
            group_size=1,
            concurrency=4,
            timeout_s=60,
            model=DEMONSTRATOR,
        )
        await hosted.parts.settled()
    assert [g.rewards for g in report.groups] == [
        {t: 1.0} for g in report.groups for t in g.trajectory_ids
    ]

    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        recorded = await stored_demonstrations(
            store, StoreDemonstrations(model=DEMONSTRATOR, min_reward=1.0), lambda _: False
        )
        # Each rollout is one trajectory of two calls: the tool call, then the answer.
        trajectories = await store.trajectories(split="train")
        calls = await store.calls([t.id for t in trajectories])
    finally:
        await store.aclose()
    assert len(recorded) == len(trajectories) == 4
    assert sorted(len(c) for c in calls.values()) == [2, 2, 2, 2]
    assert not any(call.trainable for c in calls.values() for call in c)  # text only

    tokenizer = load_model(str(stack.model_dir)).tokenizer
    [sequence] = demonstration_sequences(
        recorded[0], ChatRenderer(tokenizer), int(tokenizer.eos_token_id)
    )
    learnt = [t for t, m in zip(sequence.tokens, sequence.mask, strict=True) if m]
    context = [t for t, m in zip(sequence.tokens, sequence.mask, strict=True) if not m]
    # The rollouts ran at once: the first stored is any of the four cities.
    city = city_asked(next(m["content"] for m in recorded[0].messages if m["role"] == "user"))
    assert city is not None
    assert tokenizer.decode(learnt) == (
        f'<tool_call>\n{{"name": "lookup_code_word", "arguments": {{"city": "{city}"}}}}\n'
        f"</tool_call><|im_end|>The code word of {city} is {code_word(city)}.<|im_end|>"
    )
    assert "What is the code word" in tokenizer.decode(context)  # the prompt: not learnt
    assert f"<|im_start|>tool\n{code_word(city)}" in tokenizer.decode(context)  # nor the result

    settings = TrainSettings.model_validate(
        {
            "store": stack.store_url,
            "proxy": stack.proxy.root_url,
            "upstream": [stack.llm.base_url],
            "model": str(stack.model_dir),
            "out": str(tmp_path / "run"),
            "agent": f"{HERE / 'agent.py'}:rollout",
            "scenarios": str(SCENARIOS),
            "steps": 1,
            "group_size": 2,
            "groups_per_step": 1,
            "val_every": 0,
            "learning_rate": 1e-2,
            "sft": "store",
            "sft_model": DEMONSTRATOR,
            "sft_batch_size": 2,
            "sft_epochs": 1,
            "rollout_timeout": 60,
        }
    )
    summary = await run_train(settings, Console(quiet=True))
    assert summary.stopped == "reached --steps 1"
    store = await TrajectoryStore.open(stack.store_url, writer=False)
    try:
        steps = await store.training_steps(run="run")
        [alias] = await store.aliases()
        members = {g: await store.trajectories(group=g, limit=10) for g in steps[-1].groups}
        grpo_calls = await store.calls([t.id for group in members.values() for t in group])
    finally:
        await store.aclose()
    assert [(s.step, s.kind, s.swap) for s in steps] == [
        (1, "sft", "swapped"),
        (2, "sft", "swapped"),
        (3, "grpo", steps[-1].swap),
    ]
    assert steps[0].metrics["tokens"] > 0 and steps[0].groups == {}
    # What the agent reported of the GRPO rollouts, a mean per step (the dashboard's chart).
    rollouts = [t for group in members.values() for t in group]
    used = [t.metrics["used_tools"] for t in rollouts]
    assert steps[-1].metrics["agent/used_tools"] == pytest.approx(sum(used) / len(used))
    assert "agent/tool_calls" in steps[-1].metrics and "agent/used_tools" not in steps[0].metrics
    # The GRPO rollouts were served by the warm start's adapter, one trajectory each.
    assert members and all(len(group) == 2 for group in members.values())
    assert {untagged(calls[0].model or "") for calls in grpo_calls.values()} == {f"{TINY_NAME}@2"}
    assert untagged(alias.model).startswith(f"{TINY_NAME}@")
