"""Best-of-N at serve time: N candidates sampled in one call, the best answered, all N recorded as
one judged group.

The proxy runs on loopback in front of the fake vLLM (whose choice i says "<reply> (i)"), over
SQLite, and is called by the OpenAI SDK and the Agents SDK as they are, with only a header added.
The chooser is a check written to a file as a user would: it likes candidate 2 best.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agents import Agent, Runner, set_default_openai_api, set_default_openai_client
from openai import AsyncOpenAI, BadRequestError
from openai.types.chat import ChatCompletionMessageParam

from art_proxy.config import ProxySettings
from art_proxy.errors import ConfigError
from art_proxy.proxy.best_of import BEST_OF_ANSWER
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import BEST_OF_JUDGE_PREFIX, TrajectoryRecord
from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from tests.conftest import proxy_settings, trajectories
from tests.ruler.scripted_judge import (
    Reply,
    Script,
    ScriptedJudge,
    answer_by_content,
    running_scripted_judge,
)

MODEL = "qwen-fake"
REPLY = "Invoices live in the invoices table."
TASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Which table holds the invoices?"}
]
CHECK = '''
def likes_two(messages, choice):
    """Candidate 2 scores 1, the others less; a message that is not the task's raises."""
    assert messages[-1]["role"] == "user"
    content = choice["message"]["content"] or ""
    return 1.0 if content.endswith("(2)") else 0.25 if "(" in content else 0.5


def raises(messages, choice):
    raise RuntimeError("the checker is down")


async def slow(messages, choice):
    import asyncio

    await asyncio.sleep(30)
    return 1.0
'''
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


@pytest.fixture
def check_file(tmp_path: Path) -> Path:
    path = tmp_path / "checks.py"
    path.write_text(CHECK)
    return path


async def serving(
    store_url: str, check_file: Path, check: str = "likes_two", **settings: object
) -> AsyncIterator[RunningProxy]:
    config = FakeVllmConfig(model=MODEL, reply=REPLY)
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(
            proxy_settings(
                store_url, vllm.base_url, best_of_check=f"{check_file}:{check}", **settings
            )
        ) as running,
    ):
        yield running


@pytest.fixture
async def proxy(sqlite_url: str, check_file: Path) -> AsyncIterator[RunningProxy]:
    async for running in serving(sqlite_url, check_file):
        yield running


def client(proxy: RunningProxy, best_of: int | None = 4) -> AsyncOpenAI:
    headers = {"X-Art-Best-Of": str(best_of)} if best_of is not None else {}
    return AsyncOpenAI(base_url=proxy.base_url, api_key="unused", default_headers=headers)


def served_and_candidates(
    listed: list[TrajectoryRecord],
) -> tuple[list[TrajectoryRecord], list[TrajectoryRecord]]:
    served = [t for t in listed if t.finish_reason != "best_of"]
    return served, [t for t in listed if t.finish_reason == "best_of"]


async def test_the_agent_gets_the_best_candidate_and_the_group_is_recorded_judged(
    proxy: RunningProxy,
) -> None:
    async with client(proxy) as openai:
        reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
    assert reply.choices[0].message.content == f"{REPLY} (2)"
    assert len(reply.choices) == 1 and reply.choices[0].index == 0
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    served, candidates = served_and_candidates(await trajectories(proxy))
    store = proxy.parts.store
    (judgment,) = await store.judgments(group=candidates[0].group_id)
    groups = await store.trainable_groups("any-run", source="judgment")
    async with aiohttp.ClientSession() as http:
        health = await (await http.get(f"{proxy.root_url}/health")).json()

    # The agent's own trajectory records the answer it got, and goes on as any would.
    (agent,) = served
    assert agent.status == "open" and agent.calls is not None
    (call,) = agent.calls
    assert call.response is not None
    assert call.response["choices"][0]["message"]["content"] == f"{REPLY} (2)"
    # Chosen as the best of four, it was not sampled as any one sample is: it trains only as
    # the candidate it is, in the candidates' group.
    assert (call.trainable, call.untrainable_reason) == (False, BEST_OF_ANSWER)
    # The four candidates: one call each, a group of their own, finished, with ids and logprobs.
    assert len(candidates) == 4
    assert len({t.group_id for t in candidates}) == 1
    assert candidates[0].group_id != agent.group_id
    assert {t.scenario_id for t in candidates} == {agent.scenario_id}
    texts = set()
    for candidate in candidates:
        assert (candidate.status, candidate.metadata) == ("finished", {"best_of": agent.id})
        (sample,) = candidate.calls or []
        assert (sample.attribution, sample.status, sample.trainable) == ("best_of", "ok", True)
        assert sample.completion_token_ids and sample.logprobs and sample.prompt_token_ids
        assert len(sample.completion_token_ids) == 1  # one choice each, n was the proxy's
        assert sample.response is not None
        texts.add(sample.response["choices"][0]["message"]["content"])
    assert texts == {REPLY, *(f"{REPLY} ({i})" for i in (1, 2, 3))}
    # The ranking that chose is the group's judgment, and what the trainer reads.
    assert judgment.status == "scored"
    assert (
        judgment.judge_model == f"{BEST_OF_JUDGE_PREFIX}check:{proxy.parts.settings.best_of_check}"
    )
    rewards = {score.trajectory_id: score.reward for score in judgment.scores}
    assert sorted(rewards.values()) == [0.25, 0.25, 0.5, 1.0]
    (group,) = groups
    assert group.rewards == rewards
    assert health["best_of"]["calls"] == 1 and health["best_of"]["candidates"] == 4
    assert health["best_of"]["unjudged"] == 0 and health["best_of"]["mean_choose_ms"] >= 0


async def test_the_calls_after_a_best_of_answer_train_as_any(proxy: RunningProxy) -> None:
    async with client(proxy) as openai:
        reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
        answer = reply.choices[0].message.content
        assert answer is not None
        follow_up: list[ChatCompletionMessageParam] = [
            *TASK,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And the customers?"},
        ]
        await openai.chat.completions.create(model=MODEL, messages=follow_up)
    (agent,), _ = served_and_candidates(await trajectories(proxy))
    chosen, later = agent.calls or []
    assert (chosen.trainable, later.trainable, later.stitched) == (False, True, True)


async def test_a_stream_gets_the_chosen_candidate_with_its_usage(proxy: RunningProxy) -> None:
    async with client(proxy, 3) as openai:
        stream = await openai.chat.completions.create(
            model=MODEL,
            messages=TASK,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"{REPLY} (2)"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    served, candidates = served_and_candidates(await trajectories(proxy))
    (call,) = served[0].calls or []
    assert call.stream and call.completion_token_ids and call.logprobs
    assert len(candidates) == 3


async def test_the_agents_sdk_gets_the_chosen_answer_through_the_responses_api(
    proxy: RunningProxy,
) -> None:
    set_default_openai_client(client(proxy, 3))
    set_default_openai_api("responses")
    agent = Agent(name="tables", instructions="Name the table.", model=MODEL)
    result = await Runner.run(agent, "Which table holds the invoices?")
    assert result.final_output == f"{REPLY} (2)"
    served, candidates = served_and_candidates(await trajectories(proxy))
    assert [call.dialect for call in served[0].calls or []] == ["responses"]
    assert len(candidates) == 3


async def test_calls_best_of_cannot_answer_are_answered_as_asked(proxy: RunningProxy) -> None:
    """A client that sends the header on every call: later turns, n > 1 and temperature 0 are
    answered as they ask (only an opening call is sampled N times)."""
    async with client(proxy) as openai:
        first = await openai.chat.completions.create(model=MODEL, messages=TASK)
        turn: list[ChatCompletionMessageParam] = [
            *TASK,
            {"role": "assistant", "content": first.choices[0].message.content},
        ]
        turn.append({"role": "user", "content": "And the customers?"})
        later = await openai.chat.completions.create(model=MODEL, messages=turn)
        greedy = await openai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Greedy?"}],
            temperature=0,
        )
        several = await openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Two?"}], n=2
        )
    assert later.choices[0].message.content == REPLY
    assert greedy.choices[0].message.content == REPLY
    assert len(several.choices) == 2
    assert proxy.parts.counters.best_of_calls == 1


async def test_a_bad_header_is_refused_as_openai_would_and_recorded(proxy: RunningProxy) -> None:
    async with client(proxy, None) as openai:
        with pytest.raises(BadRequestError) as refused:
            await openai.chat.completions.create(
                model=MODEL,
                messages=TASK,
                extra_headers={"X-Art-Best-Of": "many"},
            )
    assert refused.value.status_code == 400
    assert "X-Art-Best-Of must be a whole number from 1 to 16" in str(refused.value)
    (refusal,) = await trajectories(proxy)
    assert [call.status for call in refusal.calls or []] == ["rejected"]


async def test_a_header_without_a_chooser_is_refused(sqlite_url: str) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(model=MODEL)) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as plain,
        client(plain) as openai,
    ):
        with pytest.raises(BadRequestError) as refused:
            await openai.chat.completions.create(model=MODEL, messages=TASK)
    assert "has no chooser" in str(refused.value)


@pytest.mark.parametrize(
    ("check", "settings"), [("raises", {}), ("slow", {"best_of_timeout": 0.2})]
)
async def test_a_chooser_that_fails_or_runs_late_answers_the_first_candidate(
    sqlite_url: str, check_file: Path, check: str, settings: dict[str, Any]
) -> None:
    async for proxy in serving(sqlite_url, check_file, check, **settings):
        async with client(proxy, 3) as openai:
            reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
        assert reply.choices[0].message.content == REPLY
        _, candidates = served_and_candidates(await trajectories(proxy))
        assert len(candidates) == 3
        assert await proxy.parts.store.judgments(group=candidates[0].group_id) == []
        assert proxy.parts.counters.best_of_unjudged == 1


async def test_prod_calls_are_drawn_by_the_fraction(sqlite_url: str, check_file: Path) -> None:
    async for proxy in serving(
        sqlite_url, check_file, best_of=2, best_of_fraction=1.0, default_split="prod"
    ):
        async with client(proxy, None) as openai:
            reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
        assert reply.choices[0].message.content == REPLY  # 0.5, against 0.25 for "(1)"
        _, candidates = served_and_candidates(await trajectories(proxy))
        assert len(candidates) == 2


@contextlib.asynccontextmanager
async def judged_by_ruler(
    store_url: str, script: Script, **settings: object
) -> AsyncIterator[tuple[ScriptedJudge, RunningProxy]]:
    """A proxy choosing with `--best-of-judge`, its RULER a scripted judge answering `script`."""
    async with (
        running_scripted_judge(script) as judge,
        running_fake_vllm(FakeVllmConfig(model=MODEL, reply=REPLY)) as vllm,
        running_proxy(
            proxy_settings(
                store_url,
                vllm.base_url,
                best_of_judge="openai/judge",
                best_of_judge_base_url=judge.base_url,
                **settings,
            )
        ) as proxy,
    ):
        yield judge, proxy


async def test_ruler_ranks_the_candidates_against_each_other(sqlite_url: str) -> None:
    """`--best-of-judge`: one judge call sees every candidate after the call's messages, and its
    ranking both chooses the answer and is the group's judgment."""
    script = answer_by_content(lambda text: 0.9 if "(2)" in text else 0.1)
    async with (
        judged_by_ruler(sqlite_url, script) as (judge, proxy),
        client(proxy, 3) as openai,
    ):
        reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
        _, candidates = served_and_candidates(await trajectories(proxy))
        (judgment,) = await proxy.parts.store.judgments(group=candidates[0].group_id)

    assert reply.choices[0].message.content == f"{REPLY} (2)"
    assert len(judge.requests) == 1
    shown = judge.prompt()
    assert "Which table holds the invoices?" in shown and f"{REPLY} (1)" in shown
    assert judgment.status == "scored"
    assert judgment.judge_model == f"{BEST_OF_JUDGE_PREFIX}ruler:openai/judge"
    assert sorted(score.reward for score in judgment.scores) == [0.1, 0.1, 0.9]


async def test_with_redact_pii_the_best_of_judge_sees_placeholders(sqlite_url: str) -> None:
    script = answer_by_content(lambda text: 0.9 if "(2)" in text else 0.1)
    email = "jane.doe@example.com"
    task: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": f"Which table holds the invoices? Mail {email}"}
    ]
    async with (
        judged_by_ruler(sqlite_url, script, redact_pii=True) as (judge, proxy),
        client(proxy, 2) as openai,
    ):
        await openai.chat.completions.create(model=MODEL, messages=task)
    shown = judge.prompt()
    assert email not in shown and "<EMAIL_ADDRESS_1>" in shown


async def test_a_group_whose_serve_time_judge_failed_is_left_to_the_offline_judge(
    sqlite_url: str,
) -> None:
    """A scored best-of group is never judged again; one whose RULER answered nothing usable is
    recorded with its failed judgment and stays open to `art-proxy judge`."""
    async with (
        judged_by_ruler(sqlite_url, Reply("not a judgment")) as (_, proxy),
        client(proxy, 2) as openai,
    ):
        reply = await openai.chat.completions.create(model=MODEL, messages=TASK)
        _, candidates = served_and_candidates(await trajectories(proxy))
        store = proxy.parts.store
        (failed,) = await store.judgments(group=candidates[0].group_id)
        open_to = await store.unjudged_groups(judge_model="m", mode="json", rubric_hash="r")

    assert reply.choices[0].message.content == REPLY  # the first candidate
    assert failed.status == "judge_failed"
    assert candidates[0].group_id in {group.id for group in open_to}


def test_settings_refuse_a_fraction_without_a_chooser_and_two_choosers() -> None:
    base = {"store": "sqlite:///x.db", "upstream": ["http://127.0.0.1:1/v1"]}
    with pytest.raises(ValueError, match="needs a chooser"):
        ProxySettings.model_validate({**base, "best_of_fraction": 0.5})
    with pytest.raises(ValueError, match="not both"):
        ProxySettings.model_validate({**base, "best_of_check": "a:b", "best_of_judge": "m"})


async def test_a_check_that_cannot_be_loaded_stops_the_proxy_before_it_serves(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = proxy_settings(sqlite_url, "http://127.0.0.1:9/v1", best_of_check="nowhere.py:f")
    with pytest.raises(ConfigError, match=r"--best-of-check file 'nowhere\.py' does not exist"):
        async with running_proxy(settings):
            pass
