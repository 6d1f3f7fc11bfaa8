"""The LangGraph email agent of `examples/langgraph_email_agent/`: its inbox tools, its questions,
and one rollout through the real proxy with the fake vLLM scripted to search, read, then answer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from art_proxy.proxy.server import running_proxy
from art_proxy.records import JsonObject
from art_proxy.rollout import run_rollouts
from art_proxy.scenarios import Scenario, load_scenarios
from art_proxy.testing.fake_vllm import FakeVllmConfig, ScriptedCall, running_fake_vllm
from examples.langgraph_email_agent.agent import correct, rollout
from examples.langgraph_email_agent.inbox import inbox, read_email, search_inbox
from tests.conftest import proxy_settings, trajectories

# create_react_agent is the API the issue names; LangGraph 1.x points to langchain.agents instead.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

SCENARIOS = (
    Path(__file__).resolve().parent.parent / "examples/langgraph_email_agent/scenarios.jsonl"
)
RETURN_FLIGHT = 32  # the email of "What is the flight number of Sam's return flight from Denver?"


def search(keywords: str) -> list[dict[str, object]]:
    hits: list[dict[str, object]] = json.loads(search_inbox.invoke({"keywords": keywords}))
    return hits


def test_search_finds_the_email_that_holds_the_fact() -> None:
    best = search("return flight Denver")[0]
    assert best["id"] == RETURN_FLIGHT
    assert set(best) == {"id", "from", "date", "subject", "snippet"}
    assert best["subject"] == "Your return flight from Denver"


@pytest.mark.parametrize("keywords", ['"foo" OR (', "NEAR(flight", "subject:", "*", "", "AND OR"])
def test_search_reads_query_syntax_as_plain_words(keywords: str) -> None:
    assert isinstance(search(keywords), list)


def test_read_email_gives_the_whole_email_and_an_unknown_id_is_an_error_message() -> None:
    email = json.loads(read_email.invoke({"email_id": RETURN_FLIGHT}))
    assert email["from"] == "bookings@tripdesk.com" and "UA 2291" in email["body"]
    unknown = read_email.invoke({"email_id": 999})
    assert unknown.startswith("Error: there is no email with id 999")


def test_an_answer_is_correct_when_it_holds_the_reference() -> None:
    assert correct("Your return flight is ua2291.", "UA 2291") == 1.0
    assert correct("It leaves at 3:00pm", "3:00 PM") == 1.0
    assert correct("UA 1472", "UA 2291") == 0.0


def test_every_reference_answer_is_written_in_its_email() -> None:
    scenarios = load_scenarios(SCENARIOS)
    assert Counter(s.split for s in scenarios) == {"train": 24, "val": 8}
    for scenario in scenarios:
        email = inbox().read(scenario.metadata["email_id"])
        assert email is not None, scenario.id
        text = email["subject"] + "\n" + email["body"]
        assert correct(text, scenario.reference) == 1.0, scenario.id


def return_flight_question() -> Scenario:
    [scenario] = [s for s in load_scenarios(SCENARIOS) if s.metadata["email_id"] == RETURN_FLIGHT]
    return scenario


def tools_called(response: JsonObject | None) -> list[str]:
    message = response["choices"][0]["message"] if response else {}
    return [call["function"]["name"] for call in message.get("tool_calls") or []]


@pytest.mark.parametrize(("answer", "expected"), [("It is UA 2291.", 1.0), ("It is UA 1472.", 0.0)])
async def test_rollout_searches_reads_and_answers_in_one_stitched_trajectory(
    sqlite_url: str, answer: str, expected: float
) -> None:
    script = (
        ScriptedCall(name="search_inbox", arguments={"keywords": "return flight Denver"}),
        ScriptedCall(name="read_email", arguments={"email_id": RETURN_FLIGHT}),
    )
    config = FakeVllmConfig(tool_script=script, answer_after_tool=answer)
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
    ):
        report = await run_rollouts(
            rollout,
            [return_flight_question()],
            proxy_url=proxy.root_url,
            group_size=1,
            concurrency=1,
            timeout_s=60,
            model=config.model,
        )
        [trajectory] = await trajectories(proxy)

    [group] = report.groups
    assert group.rewards == {trajectory.id: expected} and not group.errors and not report.warnings
    assert trajectory.status == "finished" and trajectory.reward == expected
    assert trajectory.split == "val" and trajectory.group_id == group.group_id
    assert trajectory.calls is not None
    assert [tools_called(call.response) for call in trajectory.calls] == [
        ["search_inbox"],
        ["read_email"],
        [],
    ]
    assert all(call.trainable for call in trajectory.calls)
    assert [call.stitched for call in trajectory.calls] == [False, True, True]
    read = trajectory.calls[2].request["messages"][-1]
    assert read["role"] == "tool" and "UA 2291" in read["content"]
