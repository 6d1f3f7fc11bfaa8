"""Judge prompt tokens: one RULER call per group against one call per trajectory.

RULER shows a group's shared beginning once; judging each trajectory alone repeats the whole
conversation (and the rubric) in every call. The workload: groups of 4, 8 and 16 runs of a
tool-using agent whose opening (system prompt with a dozen tool schemas, rules and policies, then
the task) is ~4k tokens, each run then taking 3-6 tool steps and a final plan (~700 tokens).
Tokens are counted with a real BPE tokenizer (litellm's; OpenAI's cl100k where it knows no
better) on the prompts `art_proxy.ruler.prompt` builds. Target: at most 0.3x at 8.

    .venv/bin/python benchmarks/ruler_tokens.py [--judge openai/gpt-4o-mini] [--seed 0]

The last line is the key figure.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from art_proxy.records import JsonObject
from art_proxy.ruler.judge import litellm_token_counter
from art_proxy.ruler.prompt import Member, TokenCounter, build_prompt, render_message
from art_proxy.ruler.rubric import DEFAULT_RUBRIC

SIZES = (4, 8, 16)
TARGET_AT_8 = 0.3
# An MCP-style tool set: a dozen tools with their schemas make a system prompt of ~5k tokens.
TOOLS = (
    "search_flights",
    "search_trains",
    "search_hotels",
    "hotel_details",
    "get_weather",
    "currency_convert",
    "list_attractions",
    "opening_hours",
    "book_flight",
    "book_hotel",
    "book_tour",
    "send_itinerary",
)
WORDS = (
    *("check", "prices", "compare", "options", "prefer", "direct", "flights", "keep", "the"),
    *("budget", "confirm", "dates", "ask", "before", "booking", "hotels", "near", "centre"),
    *("avoid", "late", "arrivals", "note", "cancellation", "terms"),
)
PARAMETERS = ("city", "date", "nights", "adults", "budget_eur", "currency", "id", "sort_by")
CITIES = ("Lisbon", "Porto", "Madrid", "Seville", "Valencia", "Bilbao", "Granada", "Malaga")


@dataclass(frozen=True)
class Row:
    size: int
    shared_tokens: int  # the opening every trajectory starts with
    rest_tokens: int  # per trajectory, on average, after the opening
    group_tokens: int  # one call for the group
    alone_tokens: int  # N calls, each with one full conversation

    @property
    def ratio(self) -> float:
        return self.group_tokens / self.alone_tokens


def opening(rng: random.Random) -> list[JsonObject]:
    """A tool-using agent's system prompt (~5k tokens: tool schemas, rules, policies), its task."""
    tools = "\n".join(
        f"- {name}: {json.dumps(_schema(name, rng))}\n  Use it when the user's request needs "
        f"{name.replace('_', ' ')}; never guess its result. Rules for {name}: "
        + " ".join(f"rule {i}: {_sentence(rng)}" for i in range(6))
        for name in TOOLS
    )
    system = (
        "You are TravelAgent, an assistant that plans and books trips. Think step by step, call "
        "tools for facts, and finish with a short plan the traveller can follow.\n\n"
        f"Tools:\n{tools}\n\nPolicies:\n"
        + "\n".join(f"{i}. {_sentence(rng)}" for i in range(1, 21))
    )
    task = (
        "Plan a 4-day trip from Berlin to Spain or Portugal next month for two adults, under "
        "1500 EUR in total, with a hotel near the old town and one day trip. Book what you can."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def trajectory(rng: random.Random, shared: list[JsonObject]) -> list[JsonObject]:
    """One run: a few tool calls with JSON results, then a final plan; runs differ from turn one."""
    messages = list(shared)
    for step in range(rng.randint(3, 6)):
        name = rng.choice(TOOLS)
        arguments = {"city": rng.choice(CITIES), "date": f"2026-12-{rng.randint(1, 28):02d}"}
        call_id = f"call_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": _sentence(rng),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        )
        results = [
            {"option": i, "city": rng.choice(CITIES), "price_eur": rng.randint(40, 600)}
            for i in range(rng.randint(3, 6))
        ]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(results)})
    plan = " ".join(_sentence(rng) for _ in range(rng.randint(3, 6)))
    messages.append({"role": "assistant", "content": f"Plan: {plan}"})
    return messages


def measure(size: int, count: TokenCounter, seed: int) -> Row:
    rng = random.Random(seed * 1000 + size)
    shared = opening(rng)
    members = [Member(f"run-{i}", trajectory(rng, shared)) for i in range(size)]
    group = build_prompt(members, DEFAULT_RUBRIC, "json", count_tokens=count).tokens
    alone = sum(
        build_prompt([member], DEFAULT_RUBRIC, "json", count_tokens=count).tokens
        for member in members
    )
    rest = sum(count(_text(member.messages[len(shared) :])) for member in members) // size
    return Row(size, count(_text(shared)), rest, group, alone)


def _text(messages: Sequence[JsonObject]) -> str:
    return "\n\n".join(render_message(message, None, "tools") for message in messages)


def _schema(name: str, rng: random.Random) -> JsonObject:
    fields = rng.sample(PARAMETERS, 5)
    properties = {f: {"type": "string", "description": _sentence(rng)} for f in fields}
    return {
        "name": name,
        "description": _sentence(rng),
        "parameters": {"type": "object", "properties": properties, "required": fields[:2]},
    }


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--judge", default="openai/gpt-4o-mini", help="whose tokenizer counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = litellm_token_counter(args.judge)
    rows = [measure(size, count, args.seed) for size in SIZES]
    header = f"{'group':>5} {'shared':>7} {'rest':>5} {'RULER, 1 call':>14} {'alone, N calls':>15}"
    print(f"{header} {'ratio':>6}")
    for row in rows:
        print(
            f"{row.size:>5} {row.shared_tokens:>7,} {row.rest_tokens:>5,} {row.group_tokens:>14,} "
            f"{row.alone_tokens:>15,} {row.ratio:>5.2f}x"
        )
    at_8 = next(row for row in rows if row.size == 8)
    verdict = "meets" if at_8.ratio <= TARGET_AT_8 else "MISSES"
    print(
        f"judge prompt tokens at group size 8: {at_8.ratio:.2f}x of judging each trajectory "
        f"alone ({verdict} the {TARGET_AT_8}x target)"
    )


if __name__ == "__main__":
    main()
