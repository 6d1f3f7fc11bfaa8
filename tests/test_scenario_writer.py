"""`art-proxy scenarios generate`: scenarios written by a model from an agent's tools (a tools
file, an MCP server's own list) or from real openings in the store.

The writer is a scripted OpenAI-compatible server on loopback (its answers fixed, what it was sent
kept), reached through litellm as any writer is; the command runs as a user runs it. The MCP
server is the MCP example's, started over stdio.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai

from art_proxy.config.scenario_writer import THINKING_TOKENS
from art_proxy.proxy.server import RunningProxy
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.scenario_writer import (
    TOKENS_PER_TASK,
    Tool,
    Written,
    tasks_of,
    tools_prompt,
    write_scenarios,
)
from art_proxy.scenarios import load_scenarios
from tests.ruler.scripted_judge import Reply, ScriptedJudge, running_scripted_judge, tokens_in

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city today.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"name": "convert_currency", "description": "Convert an amount.", "inputSchema": {}},
]
FIRST = (
    "1. What is the weather in Lyon today?\n"
    "2) Convert 20 euros to yen, please.\n"
    "- what is the weather in LYON today\n"  # the first again, by its words
    "ok\n"  # too short to be a task
)
SECOND = '"Will it rain in Oslo this afternoon?"\n* How many dollars is 300 kroner?\n'


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "scenarios", "generate", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def writer_args(writer: ScriptedJudge, out: Path) -> tuple[str, ...]:
    return ("--writer", "openai/writer", "--writer-base-url", writer.base_url, "--out", str(out))


def sent(writer: ScriptedJudge, index: int) -> str:
    return json.dumps(writer.requests[index]["messages"])


async def test_from_a_tools_file_tasks_are_cleaned_deduplicated_and_split(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    out = tmp_path / "scenarios.jsonl"
    async with running_scripted_judge(Reply(FIRST), Reply(SECOND)) as writer:
        done = await asyncio.to_thread(
            generate,
            "--tools",
            str(tools),
            "--count",
            "4",
            "--val-fraction",
            "0.25",
            *writer_args(writer, out),
        )
    scenarios = load_scenarios(out)

    assert done.returncode == 0, done.stderr
    assert "wrote 4 scenarios (3 train, 1 val)" in done.stderr
    assert [s.input for s in scenarios] == [
        "What is the weather in Lyon today?",
        "Convert 20 euros to yen, please.",
        "Will it rain in Oslo this afternoon?",
        "How many dollars is 300 kroner?",
    ]
    assert sorted(s.split for s in scenarios) == ["train", "train", "train", "val"]
    assert all(
        s.metadata == {"generated_by": "openai/writer", "source": "tools"} for s in scenarios
    )
    assert "get_weather" in sent(writer, 0) and "convert_currency" in sent(writer, 0)
    assert "city (string)" in sent(writer, 0)
    # The second batch asks for what is missing, shown what was written.
    assert "Write 2 different requests" in sent(writer, 1)
    assert "Already written" in sent(writer, 1) and "Lyon" in sent(writer, 1)


async def test_from_an_mcp_server_the_writer_is_shown_the_tools_it_lists(tmp_path: Path) -> None:
    out = tmp_path / "scenarios.jsonl"
    server = f"{sys.executable} -m examples.mcp_agent.server"
    async with running_scripted_judge(
        Reply("How many pears are on the shelf?\nWhat do 3 mangos cost?")
    ) as writer:
        done = await asyncio.to_thread(
            generate, "--mcp", server, "--count", "2", *writer_args(writer, out)
        )

    assert done.returncode == 0, done.stderr
    assert len(load_scenarios(out)) == 2
    for tool in ("stock", "price", "total_cost"):
        assert f"- {tool}:" in sent(writer, 0)


async def test_from_the_store_the_writer_sees_real_openings(
    proxy: RunningProxy, tmp_path: Path
) -> None:
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-Split": "prod"}
    ) as client:
        for question in (
            "Where is my parcel 7731?",
            "Cancel my order from Tuesday.",
            "Send the invoice to jane.doe@example.com please.",
        ):
            messages: list[Any] = [{"role": "user", "content": question}]
            await client.chat.completions.create(
                model="Qwen/Qwen2.5-0.5B-Instruct", messages=messages
            )
    await proxy.parts.settled()
    out = tmp_path / "scenarios.jsonl"
    async with running_scripted_judge(Reply("Where is the parcel I ordered on Monday?")) as writer:
        done = await asyncio.to_thread(
            generate,
            "--from-store",
            "--store",
            proxy.parts.settings.store,
            "--count",
            "1",
            "--redact-pii",
            *writer_args(writer, out),
        )

    assert done.returncode == 0, done.stderr
    assert "Where is my parcel 7731?" in sent(writer, 0)
    assert "Cancel my order from Tuesday." in sent(writer, 0)
    # Real users' words reach the writer with their personal data replaced.
    assert "jane.doe@example.com" not in sent(writer, 0)
    assert "Send the invoice to <EMAIL_ADDRESS_1> please." in sent(writer, 0)
    [scenario] = load_scenarios(out)
    assert scenario.metadata["source"] == "store"


async def test_a_writer_that_repeats_itself_stops_with_fewer_and_says_so(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    out = tmp_path / "scenarios.jsonl"
    async with running_scripted_judge(Reply("What is the weather in Lyon today?")) as writer:
        done = await asyncio.to_thread(
            generate, "--tools", str(tools), "--count", "3", *writer_args(writer, out)
        )

    assert done.returncode == 0, done.stderr
    assert len(writer.requests) == 3  # as many rounds as three batches would take
    assert "wrote 1 scenarios (1 train, 0 val); asked for 3" in done.stderr
    assert len(load_scenarios(out)) == 1


async def write_in_process(served: ScriptedJudge, count: int) -> Written:
    """`write_scenarios` for a weather tool with `served` as the writer, checked first as the
    command checks it (its context, where it says one)."""
    tools = [Tool("get_weather", "The weather in a city today.", {})]
    writer = LitellmJudge("openai/writer", base_url=served.base_url)
    try:
        await writer.check()
        return await write_scenarios(
            writer, lambda asked, avoid: tools_prompt(tools, asked, avoid), count=count
        )
    finally:
        await writer.aclose()


async def test_a_batchs_answer_has_a_bounded_room_and_a_line_cut_at_its_end_is_left_out() -> None:
    cut = Reply("What is the weather in Lyon today?\nConvert 20 euros to y", finish_reason="length")
    async with running_scripted_judge(cut, Reply("How many dollars is 300 kroner?")) as served:
        written = await write_in_process(served, count=2)

    assert [request["max_tokens"] for request in served.requests] == [
        2 * TOKENS_PER_TASK + THINKING_TOKENS,
        1 * TOKENS_PER_TASK + THINKING_TOKENS,
    ]
    assert sorted(scenario.input for scenario in written.scenarios) == [
        "How many dollars is 300 kroner?",
        "What is the weather in Lyon today?",
    ]


async def test_a_batchs_room_is_what_the_writers_context_leaves_after_the_prompt() -> None:
    """A server refuses a `max_tokens` past its context (vLLM, local-llm: 400)."""
    answer = Reply("What is the weather in Lyon today?")
    async with running_scripted_judge(answer, context_tokens=400) as served:
        await write_in_process(served, count=1)

    [request] = served.requests
    assert request["max_tokens"] == 400 - tokens_in(request["messages"])


async def test_a_writer_still_thinking_at_its_rooms_end_is_said_and_given_room_to_think(
    tmp_path: Path,
) -> None:
    """A reasoning writer's thinking counts against `max_tokens` (vLLM): cut while it thinks,
    its answer holds no task; the command says so and what gives it room."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    out = tmp_path / "scenarios.jsonl"
    thinking = Reply("", reasoning="The user wants weather tasks, so", finish_reason="length")
    async with running_scripted_judge(thinking) as writer:
        done = await asyncio.to_thread(
            generate,
            *("--tools", str(tools), "--count", "2", "--writer-thinking-tokens", "3000"),
            *writer_args(writer, out),
        )

    assert done.returncode == 0, done.stderr
    assert writer.requests[0]["max_tokens"] == 2 * TOKENS_PER_TASK + 3000
    assert "wrote 0 scenarios" in done.stderr
    rounds = len(writer.requests)
    assert f"{rounds} of its answers ran out of room while it was still thinking" in done.stderr
    assert "--writer-thinking-tokens" in done.stderr


def test_without_exactly_one_source_or_with_a_bad_tools_file_it_is_a_one_line_error(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text('{"not": "a list"}')
    cases = {
        (): "pass exactly one of --mcp, --tools and --from-store",
        (
            "--tools",
            str(bad),
            "--from-store",
        ): "pass exactly one of --mcp, --tools and --from-store",
        ("--tools", str(bad)): "expected a JSON list of tools",
        ("--tools", str(tmp_path / "missing.json")): "not a readable JSON file",
    }
    for args, message in cases.items():
        done = generate(
            *args, "--writer", "openai/writer", "--writer-base-url", "http://127.0.0.1:9/v1"
        )
        assert done.returncode != 0, args
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)


def test_a_line_is_a_task_once_its_bullets_numbering_quotes_and_preamble_are_gone() -> None:
    answer = (
        "You can use the following different requests:\n"
        "- 1. How many pears are in stock today?\n"
        '**2.** "What does a single mango cost?"\n'
        "  3) What do 4 pears cost in total?\n"
        "Task 4: Is there any lemon left?\n"
        "short\n"
    )
    assert tasks_of(answer) == [
        "How many pears are in stock today?",
        "What does a single mango cost?",
        "What do 4 pears cost in total?",
        "Is there any lemon left?",
    ]
