"""`art-proxy scenarios generate`: tasks for an agent written by an LLM from what the agent can do.

The source is the agent's own tools (an MCP server's `tools/list`, or a tools file in OpenAI's or
MCP's form) or real openings from production (the scenario bank). A writer model, any litellm
model (the bundled one through `art-proxy local-llm` included), is asked for tasks a batch at a
time, one a line: a line is the simplest answer for a small model to get right, and JSON from it
would often not parse. Lines are cleaned of numbering and quotes, kept between `MIN_CHARS` and
`MAX_CHARS`, and deduplicated by their words (case, punctuation and spacing aside), against the
tasks already written too; batches go on until there are enough or `max_rounds` brought too few.
A seeded shuffle puts `val_fraction` of them in the `val` split. Each scenario's id is a hash of its
input, so a file written twice names the same tasks alike.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from art_proxy.config.scenario_writer import THINKING_TOKENS
from art_proxy.errors import ConfigError
from art_proxy.records import JsonObject
from art_proxy.ruler.client import JudgeClient, JudgeRequest
from art_proxy.scenarios import Scenario, scenario_id_of

MIN_CHARS, MAX_CHARS = 12, 500
BATCH = 10  # tasks asked for in one call
# The room a batch's answer gets, in tokens: a task of MAX_CHARS fits, and a reasoning model's
# thinking has some (`THINKING_TOKENS`, `--writer-thinking-tokens`); a writer that rambles on (a
# small local model may go to the end of its context) stops there.
TOKENS_PER_TASK = MAX_CHARS // 3
_NUMBERING = re.compile(r"^\s*(?:[-*\u2022]|\(?\d{1,3}[.):]|task\s*\d*[.:])\s*", re.IGNORECASE)
_QUOTES = "\"'\u201c\u201d\u2018\u2019`"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: JsonObject  # JSON schema of its arguments


@dataclass(frozen=True)
class Written:
    scenarios: list[Scenario]
    rounds: int  # calls made to the writer
    lines: int  # lines the writer answered with, before cleaning and deduplication
    cut_while_thinking: int = 0  # answers that ran out of room before the writer had done thinking


def tools_from_file(path: Path) -> list[Tool]:
    """A JSON list of tools, in OpenAI's form (`{"type": "function", "function": {...}}`) or
    MCP's (`{"name", "description", "inputSchema"}`); `ConfigError` naming what is wrong."""
    try:
        listed = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"--tools {path}: not a readable JSON file: {exc}") from exc
    if isinstance(listed, dict) and isinstance(listed.get("tools"), list):
        listed = listed["tools"]  # an MCP `tools/list` result as saved
    if not isinstance(listed, list) or not listed:
        raise ConfigError(f"--tools {path}: expected a JSON list of tools")
    tools = []
    for index, entry in enumerate(listed):
        spec = entry.get("function", entry) if isinstance(entry, dict) else None
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(name, str) or not name:
            raise ConfigError(f"--tools {path}: tool {index} has no name")
        schema = spec.get("parameters", spec.get("inputSchema")) or {}
        tools.append(Tool(name, str(spec.get("description") or ""), dict(schema)))
    return tools


async def tools_from_mcp(command: str) -> list[Tool]:
    """The tools an MCP server started by `command` (stdio) lists."""
    import shlex

    try:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError as exc:
        raise ConfigError("--mcp needs the MCP client: pip install mcp") from exc
    words = shlex.split(command)
    if not words:
        raise ConfigError("--mcp: give the command that starts the server")
    server = StdioServerParameters(command=words[0], args=words[1:])
    try:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"--mcp {command!r}: the server did not list its tools: {exc}") from exc
    return [
        Tool(tool.name, tool.description or "", dict(tool.inputSchema or {}))
        for tool in listed.tools
    ]


def tools_prompt(tools: Sequence[Tool], count: int, avoid: Sequence[str]) -> list[JsonObject]:
    """The writer's messages for `count` tasks that need `tools`."""
    listed = "\n".join(
        f"- {tool.name}: {tool.description.strip() or '(no description)'}"
        f" Arguments: {_arguments(tool.parameters)}"
        for tool in tools
    )
    return _messages(
        f"An assistant can use these tools:\n{listed}\n\nWrite {count} different requests a user "
        "might send this assistant, each one needing at least one of the tools to answer. "
        "Vary them: different tools, different arguments, simple and harder ones.",
        avoid,
    )


def openings_prompt(openings: Sequence[str], count: int, avoid: Sequence[str]) -> list[JsonObject]:
    """The writer's messages for `count` tasks of the kind real users sent (`openings`)."""
    examples = "\n".join(f"- {opening}" for opening in openings)
    return _messages(
        f"Users sent an assistant these requests:\n{examples}\n\nWrite {count} new requests of "
        "the same kind, different from these and from each other.",
        avoid,
    )


def _messages(ask: str, avoid: Sequence[str]) -> list[JsonObject]:
    written = ""
    if avoid:
        shown = "\n".join(f"- {task}" for task in avoid[-BATCH:])
        written = f"\n\nAlready written, do not repeat:\n{shown}"
    return [
        {
            "role": "system",
            "content": "You write test requests for an AI assistant. Answer with the requests "
            "only, one per line, no numbering and no other text.",
        },
        {"role": "user", "content": ask + written},
    ]


def _arguments(schema: JsonObject) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "none"
    return ", ".join(
        f"{name} ({spec.get('type', 'any')})" if isinstance(spec, dict) else name
        for name, spec in properties.items()
    )


def tasks_of(answer: str) -> list[str]:
    """The tasks in a writer's answer: a line each, bullets, numbering and quotes removed (a
    bullet before a number too); a line that introduces the rest (it ends in a colon) or is too
    short or too long to be a task is left out."""
    tasks = []
    for line in answer.splitlines():
        task, before = line.strip(), None
        while task != before:
            before = task
            task = _NUMBERING.sub("", task).strip().strip(_QUOTES).strip().strip("*_").strip()
        if MIN_CHARS <= len(task) <= MAX_CHARS and not task.endswith(":"):
            tasks.append(task)
    return tasks


async def _answer_room(
    writer: JudgeClient, messages: list[JsonObject], asked: int, thinking: int
) -> int:
    """The tokens a batch's answer may take: room for `asked` tasks and `thinking`, within what
    the writer's context leaves after the prompt where its server says its context (`check()`);
    a server refuses a `max_tokens` past it."""
    room = asked * TOKENS_PER_TASK + thinking
    if writer.context_tokens is None:
        return room
    prompt = await writer.prompt_tokens(messages)
    if prompt is None:  # no /tokenize: a token every 3 characters, more than most tokenizers make
        prompt = sum(len(str(message.get("content", ""))) // 3 + 8 for message in messages)
    return max(1, min(room, writer.context_tokens - prompt))


def dedup_key(task: str) -> str:
    """What two tasks that differ only in case, punctuation or spacing share."""
    return " ".join(re.findall(r"\w+", task.lower()))


async def write_scenarios(
    writer: JudgeClient,
    prompt: Callable[[int, Sequence[str]], list[JsonObject]],
    *,
    count: int,
    val_fraction: float = 0.2,
    seed: int = 0,
    max_rounds: int = 0,
    source: str = "tools",
    thinking_tokens: int = THINKING_TOKENS,
) -> Written:
    """`count` distinct scenarios from `writer`; `prompt(batch, avoid)` is the messages for one
    batch (`tools_prompt` or `openings_prompt` with its source bound). Fewer when `max_rounds`
    (default: enough for `count` three times over) run out."""
    rounds_allowed = max_rounds or 3 * -(-count // BATCH)
    tasks: list[str] = []
    seen: set[str] = set()
    rounds = lines = cut_while_thinking = 0
    while len(tasks) < count and rounds < rounds_allowed:
        rounds += 1
        asked = min(BATCH, count - len(tasks))
        messages = prompt(asked, tasks)
        room = await _answer_room(writer, messages, asked, thinking_tokens)
        request = JudgeRequest(messages, mode="json", labels=0, max_tokens=room)
        reply = await writer.complete(request)
        cut_while_thinking += reply.cut_while_thinking
        # An answer cut at its room may end in a task cut short: a last line with no line end.
        answer = reply.text[: reply.text.rfind("\n") + 1] if reply.cut else reply.text
        lines += len(answer.splitlines())
        for task in tasks_of(answer):
            key = dedup_key(task)
            if key and key not in seen and len(tasks) < count:
                seen.add(key)
                tasks.append(task)
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    val = set(order[: round(len(tasks) * val_fraction)])
    scenarios = [
        Scenario(
            id=scenario_id_of(task),
            input=task,
            split="val" if index in val else "train",
            metadata={"generated_by": writer.model, "source": source},
        )
        for index, task in enumerate(tasks)
    ]
    return Written(scenarios, rounds, lines, cut_while_thinking)
