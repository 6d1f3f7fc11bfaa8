"""End to end: the bundled SmolLM2-135M, served by local-llm, judges a group in logprob mode.

A 135M model's opinion of the group is noise; what this pins down is the path: the digit prompt
reaches a real vLLM-compatible server, its `top_logprobs` come back through litellm, and every
trajectory gets an expected-digit score. Small on purpose: two short trajectories, one call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from art_proxy.local.model_loading import LoadedModel, load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import RunningLocalLlm, running_local_llm
from art_proxy.records import JsonObject, Judgment
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.recorded import answered, record_group


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_model(None)


@pytest.fixture
async def local_judge(smollm2: LoadedModel) -> AsyncIterator[RunningLocalLlm]:
    served = ServedModel.create(smollm2, max_model_len=1200, max_batch_size=2)
    async with running_local_llm(served) as running:
        yield running


async def judged_by_smollm2(
    local_judge: RunningLocalLlm, store: TrajectoryStore, group: str, *, max_prompt_tokens: int
) -> Judgment:
    """The group, judged in logprob mode by the bundled model through litellm."""
    client = LitellmJudge(f"openai/{local_judge.served.name}", base_url=local_judge.base_url)
    settings = RulerSettings(
        rubric=DEFAULT_RUBRIC, mode="logprob", max_prompt_tokens=max_prompt_tokens
    )
    try:
        return await Ruler(client, store, settings).score_group(
            group, await finished_members(store, group)
        )
    finally:
        await client.aclose()


async def test_smollm2_scores_a_group_by_its_digit_probabilities(
    local_judge: RunningLocalLlm, store: TrajectoryStore
) -> None:
    group, ids = await record_group(store, [answered("Paris."), answered("I like turtles.")])
    judgment = await judged_by_smollm2(local_judge, store, group, max_prompt_tokens=800)
    assert judgment.status == "scored", judgment.reason
    assert [score.trajectory_id for score in judgment.scores] == ids
    for score in judgment.scores:
        assert 0.0 <= score.score <= 1.0
        assert score.explanation.startswith("expected digit")
    # An expectation over several digits, not one sampled digit: not a multiple of 1/9.
    assert any(abs(score.score * 9 - round(score.score * 9)) > 1e-6 for score in judgment.scores)
    assert judgment.prompt_tokens > 0 and judgment.completion_tokens > 0
    assert judgment.cost_usd == 0.0
    assert await store.judgments(group=group) == [judgment]


def tool_agent_run(answer: str, found: str) -> list[JsonObject]:
    """A LangGraph ReAct agent's conversation as the proxy records it: a tool call, the tool's
    answer, then prose."""
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "search_inbox", "arguments": '{"query": "invoice"}'},
    }
    return [
        {"role": "system", "content": "You help the user with their email."},
        {"role": "user", "content": "When is the invoice from Acme due?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": found},
        {"role": "assistant", "content": answer},
    ]


async def test_the_bundled_judge_scores_every_trajectory_of_a_tool_agents_group(
    local_judge: RunningLocalLlm, store: TrajectoryStore
) -> None:
    """A 135M judge writes prose when asked for `t1: <digit>` lines, so a whole-answer read
    scored none of a LangGraph agent's groups. The digit is read where the judge goes on from a
    begun `tK:`, so each trajectory gets a score, in two tokens a trajectory at most."""
    runs = [
        tool_agent_run("The Acme invoice is due on March 3.", "Acme invoice, due 2025-03-03"),
        tool_agent_run("I could not find it, sorry!", "Acme invoice, due 2025-03-03"),
        tool_agent_run("Sure! Here is a poem about invoices.", "no results"),
        tool_agent_run("It is due March 3 (Acme, $120).", "Acme invoice $120, due 2025-03-03"),
    ]
    group, ids = await record_group(store, runs)
    judgment = await judged_by_smollm2(local_judge, store, group, max_prompt_tokens=900)
    assert judgment.status == "scored", judgment.reason
    assert [score.trajectory_id for score in judgment.scores] == ids
    assert all(0.0 <= score.score <= 1.0 for score in judgment.scores)
    assert judgment.completion_tokens <= 2 * len(runs)
