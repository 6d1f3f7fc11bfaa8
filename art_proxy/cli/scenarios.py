"""`art-proxy scenario-bank` and `art-proxy scenarios generate`: scenarios from recorded
openings, or written by an LLM from an agent's tools."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from art_proxy.cli.options import command_group, settings_command
from art_proxy.cli.output import fail, stderr
from art_proxy.config import ScenarioBankSettings, ScenarioWriterSettings
from art_proxy.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from art_proxy.records import JsonObject, ScenarioRecord
    from art_proxy.scenario_writer import Written


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "scenario-bank",
        ScenarioBankSettings,
        "Write the openings of recorded conversations (prod by default) as a scenarios JSONL file.",
    )(scenario_bank)


def register_group(app: typer.Typer) -> None:
    scenarios_app = command_group(
        app,
        "scenarios",
        "Scenarios for rollouts and training: written by an LLM from an agent's tools or "
        "real openings.",
    )
    settings_command(
        scenarios_app,
        "generate",
        ScenarioWriterSettings,
        "Write scenarios with an LLM from an agent's tools (--mcp, --tools) or from real openings "
        "in the store (--from-store).",
    )(scenarios_generate)


def scenario_bank(settings: ScenarioBankSettings) -> None:
    try:
        lines, skipped = asyncio.run(_scenario_bank(settings))
        with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
            out.writelines(line + "\n" for line in lines)
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    else:
        where = "standard output" if settings.out == "-" else settings.out
        note = (
            f" (skipped {skipped}: no opening or an id a scenario cannot have)" if skipped else ""
        )
        stderr.print(f"wrote {len(lines)} scenarios to {escape(where)}{note}")


async def _scenario_bank(settings: ScenarioBankSettings) -> tuple[list[str], int]:
    """The bank's JSONL lines, and how many scenarios could not become one."""
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store, existing=True) as store:
        records = await store.bank_scenarios(settings.split, settings.limit)
    lines = [line for r in records if (line := _bank_line(r, settings.split)) is not None]
    return lines, len(records) - len(lines)


def _bank_line(record: ScenarioRecord, source: str) -> str | None:
    """A scenario replaying `record`'s opening, trained on; None when it cannot be one."""
    from pydantic import ValidationError

    from art_proxy.scenarios import Scenario

    if not record.opening:
        return None
    try:
        scenario = Scenario(
            id=record.id,
            input={"messages": record.opening},
            split="train",
            metadata={"source": source, "first_seen": record.created_at.isoformat()},
        )
    except ValidationError:
        return None
    return scenario.model_dump_json()


def scenarios_generate(settings: ScenarioWriterSettings) -> None:
    try:
        written = asyncio.run(_written_scenarios(settings))
        with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
            out.writelines(s.model_dump_json() + "\n" for s in written.scenarios)
    except (ConfigError, StoreError, OSError) as exc:
        fail(str(exc))
    scenarios = written.scenarios
    val = sum(1 for scenario in scenarios if scenario.split == "val")
    short = (
        f"; asked for {settings.count}: the writer's {written.rounds} answers ({written.lines} "
        "lines) held no more distinct tasks"
        if len(scenarios) < settings.count
        else ""
    )
    if written.cut_while_thinking:
        short += (
            f"; {written.cut_while_thinking} of its answers ran out of room while it was still "
            "thinking (--writer-thinking-tokens gives it more)"
        )
    where = "standard output" if settings.out == "-" else settings.out
    stderr.print(
        f"wrote {len(scenarios)} scenarios ({len(scenarios) - val} train, {val} val){short} "
        f"to {escape(where)}",
        soft_wrap=True,  # one line, its path whole, whatever the terminal's width
    )


async def _written_scenarios(settings: ScenarioWriterSettings) -> Written:
    from art_proxy.ruler.errors import JudgeRejected, JudgeUnavailable
    from art_proxy.ruler.judge import LitellmJudge
    from art_proxy.scenario_writer import (
        openings_prompt,
        tools_from_file,
        tools_from_mcp,
        tools_prompt,
        write_scenarios,
    )

    prompt: Callable[[int, Sequence[str]], list[JsonObject]]
    if settings.tools is not None:
        source, tools = "tools", tools_from_file(Path(settings.tools))
        prompt = functools.partial(tools_prompt, tools)
    elif settings.mcp is not None:
        with stderr.status("listing the MCP server's tools..."):
            source, tools = "mcp", await tools_from_mcp(settings.mcp)
        prompt = functools.partial(tools_prompt, tools)
    else:
        source = "store"
        prompt = functools.partial(openings_prompt, await _bank_openings(settings))
    writer = LitellmJudge(
        settings.writer,
        base_url=settings.writer_base_url,
        api_key=settings.writer_api_key,
        temperature=settings.temperature,
    )
    try:
        await writer.check()
        with stderr.status(f"writing {settings.count} scenarios with {escape(settings.writer)}..."):
            return await write_scenarios(
                writer,
                prompt,
                count=settings.count,
                val_fraction=settings.val_fraction,
                seed=settings.seed,
                source=source,
                thinking_tokens=settings.writer_thinking_tokens,
            )
    except (JudgeUnavailable, JudgeRejected) as exc:
        raise ConfigError(f"writer {settings.writer}: {exc}") from exc
    finally:
        await writer.aclose()


async def _bank_openings(settings: ScenarioWriterSettings) -> list[str]:
    """The text of the last user message of the newest openings of `--split`."""
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store, existing=True) as store:
        records = await store.bank_scenarios(settings.split, settings.examples)
    openings = [text for record in records if (text := _asked(record.opening))]
    if settings.redact_pii:  # real users' words, on their way to the writer (often hosted)
        from art_proxy.privacy.pii import pii_redactor

        placeholders = pii_redactor(settings.pii_spacy_model).placeholders()
        openings = [placeholders.text(opening) for opening in openings]
    if not openings:
        raise ConfigError(
            f"the store has no opening of a {settings.split} conversation to show the writer: "
            "record some traffic first, or pass --tools or --mcp"
        )
    return openings


def _asked(opening: list[JsonObject]) -> str | None:
    """What the last user message of an opening says, as text."""
    for message in reversed(opening):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        if isinstance(content, str) and content.strip():
            return " ".join(content.split())
    return None
