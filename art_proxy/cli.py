"""`art-proxy`: the command line. Each command's flags come from its settings model (config/)."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import MofNCompleteColumn, Progress
from rich.table import Table

from art_proxy.cli_options import settings_command
from art_proxy.config import (
    AliasListSettings,
    AliasResetSettings,
    AliasSetSettings,
    DropSettings,
    EvalSettings,
    ExportSettings,
    ForgetSettings,
    HousekeepingSettings,
    JudgeSettings,
    LineageSettings,
    ProxySettings,
    RejectedSettings,
    ReplaySettings,
    RolloutSettings,
    ScenarioBankSettings,
    ScenarioWriterSettings,
    TrainSettings,
    UpSettings,
)
from art_proxy.cpu_sharing import share_cpu_cores
from art_proxy.errors import ConfigError, StoreError
from art_proxy.local.cli import LocalLlmSettings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from art_proxy.records import (
        AliasMove,
        AliasRecord,
        AliasRequest,
        ExportedTrajectory,
        JsonObject,
        Lineage,
        ScenarioRecord,
    )
    from art_proxy.rollout import Agent, RolloutReport
    from art_proxy.scenario_writer import Written
    from art_proxy.scenarios import Scenario
    from art_proxy.store.trajectory_store import TrajectoryStore

app = typer.Typer(
    name="art-proxy",
    help="Record an agent's LLM calls as trajectories (with token ids) and train it on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click errors: a usage mistake is one `Error: ...` line, not a wrapped panel.
    rich_markup_mode=None,
)
stderr = Console(stderr=True)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"art-proxy {version('art-proxy')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Record an agent's LLM calls as trajectories (with token ids) and train it on them."""


def _configure_logging(level: str = "info") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s",
        handlers=[RichHandler(console=stderr, show_path=False, rich_tracebacks=False)],
    )
    # aiohttp's access log would print every request; secrets never reach it, but noise would.
    # Alembic narrates every migration check at start-up; litellm logs every judge call at INFO
    # (twice: through its own handler and ours); httpx (the OpenAI SDK's, so every agent's) logs
    # every request at INFO: 3,280 of the 3,362 lines of a `make demo` log were its.
    # httpx2: the OpenAI SDK 3's client, which logs as httpx did.
    for chatty in ("aiohttp.access", "alembic", "LiteLLM", "LiteLLM Router", "httpx", "httpx2"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _fail(message: str) -> None:
    stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@settings_command(
    app, "serve", ProxySettings, "Serve the recording proxy in front of the upstream(s)."
)
def serve(settings: ProxySettings) -> None:
    from art_proxy.proxy.server import serve as serve_forever

    _configure_logging(settings.log_level)
    try:
        serve_forever(settings)
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))


@settings_command(
    app, "export", ExportSettings, "Write trajectories as JSONL (one a line) or Parquet."
)
def export(settings: ExportSettings) -> None:
    try:
        if settings.format != "jsonl":
            count = asyncio.run(_export_table(settings))
        else:
            with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
                count = asyncio.run(_export(settings, out))
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    else:
        where = "standard output" if settings.out == "-" else settings.out
        stderr.print(f"exported {count} trajectories to {escape(where)}")


async def _export_table(settings: ExportSettings) -> int:
    from art_proxy.export_table import write_hf_dataset, write_parquet
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store) as store:
        with stderr.status("exporting..."):
            trajectories = _exported(store, settings)
            write = write_parquet if settings.format == "parquet" else write_hf_dataset
            return await write(trajectories, Path(settings.out))


async def _exported(
    store: TrajectoryStore, settings: ExportSettings
) -> AsyncIterator[ExportedTrajectory]:
    """The trajectories `settings` selects, whole, oldest first; with `--redact-pii`, personal
    data replaced consistently across the whole export."""
    from art_proxy.pii import pii_redactor, redacted_export

    placeholders = (
        pii_redactor(settings.pii_spacy_model).placeholders() if settings.redact_pii else None
    )
    async for exported in store.export(
        scenario=settings.scenario,
        status=settings.status,
        split=settings.split,
        user=settings.user,
        tenant=settings.tenant,
    ):
        yield exported if placeholders is None else redacted_export(exported, placeholders)


async def _export(settings: ExportSettings, out: IO[str]) -> int:
    from art_proxy.journal.left_behind import opened_for_reading

    count = 0
    async with opened_for_reading(settings.store) as store:
        with stderr.status("exporting...") as status:
            async for exported in _exported(store, settings):
                out.write(exported.model_dump_json() + "\n")
                count += 1
                status.update(f"exported {count} trajectories")
    return count


@settings_command(
    app,
    "scenario-bank",
    ScenarioBankSettings,
    "Write the openings of recorded conversations (prod by default) as a scenarios JSONL file.",
)
def scenario_bank(settings: ScenarioBankSettings) -> None:
    try:
        lines, skipped = asyncio.run(_scenario_bank(settings))
        with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
            out.writelines(line + "\n" for line in lines)
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    else:
        where = "standard output" if settings.out == "-" else settings.out
        note = (
            f" (skipped {skipped}: no opening or an id a scenario cannot have)" if skipped else ""
        )
        stderr.print(f"wrote {len(lines)} scenarios to {escape(where)}{note}")


async def _scenario_bank(settings: ScenarioBankSettings) -> tuple[list[str], int]:
    """The bank's JSONL lines, and how many scenarios could not become one."""
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store) as store:
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


@settings_command(
    app, "judge", JudgeSettings, "Score every ready group with RULER and store the judgments."
)
def judge(settings: JudgeSettings) -> None:
    from art_proxy.ruler.errors import RubricError
    from art_proxy.ruler.rubric import load_rubric

    try:
        rubric = load_rubric(settings.rubric)  # before litellm's seconds-long import
        from art_proxy.ruler.command import run_judge, run_judge_check

        if settings.check:
            check = asyncio.run(run_judge_check(settings, rubric))
            Console().print(check.line(), highlight=False, soft_wrap=True)
            if not check.passed:
                raise typer.Exit(1)
            return
        asyncio.run(run_judge(settings, rubric, Console(), stderr))
    except (RubricError, ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))


scenarios_app = typer.Typer(
    help="Scenarios for rollouts and training: written by an LLM from an agent's tools or real "
    "openings.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(scenarios_app, name="scenarios")


@settings_command(
    scenarios_app,
    "generate",
    ScenarioWriterSettings,
    "Write scenarios with an LLM from an agent's tools (--mcp, --tools) or from real openings "
    "in the store (--from-store).",
)
def scenarios_generate(settings: ScenarioWriterSettings) -> None:
    try:
        written = asyncio.run(_written_scenarios(settings))
        with nullcontext(sys.stdout) if settings.out == "-" else open(settings.out, "w") as out:
            out.writelines(s.model_dump_json() + "\n" for s in written.scenarios)
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    scenarios = written.scenarios
    val = sum(1 for scenario in scenarios if scenario.split == "val")
    short = (
        f"; asked for {settings.count}: the writer's {written.rounds} answers ({written.lines} "
        "lines) held no more distinct tasks"
        if len(scenarios) < settings.count
        else ""
    )
    where = "standard output" if settings.out == "-" else settings.out
    stderr.print(
        f"wrote {len(scenarios)} scenarios ({len(scenarios) - val} train, {val} val){short} "
        f"to {escape(where)}"
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
            )
    except (JudgeUnavailable, JudgeRejected) as exc:
        raise ConfigError(f"writer {settings.writer}: {exc}") from exc
    finally:
        await writer.aclose()


async def _bank_openings(settings: ScenarioWriterSettings) -> list[str]:
    """The text of the last user message of the newest openings of `--split`."""
    from art_proxy.journal.left_behind import opened_for_reading

    async with opened_for_reading(settings.store) as store:
        records = await store.bank_scenarios(settings.split, settings.examples)
    openings = [text for record in records if (text := _asked(record.opening))]
    if settings.redact_pii:  # real users' words, on their way to the writer (often hosted)
        from art_proxy.pii import pii_redactor

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


journal_app = typer.Typer(
    help="Records the store refused, set aside beside a proxy's journal: list, put in again, drop.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(journal_app, name="journal")


def _rejected_directory(settings: RejectedSettings) -> Path:
    from art_proxy.journal.directory import journal_directory

    directory = journal_directory(settings.journal, settings.store)
    if directory is None:
        _fail("--journal off keeps no journal: nothing is set aside")
    assert directory is not None
    return directory


@settings_command(journal_app, "rejected", RejectedSettings, "List the records the store refused.")
def journal_rejected(settings: RejectedSettings) -> None:
    from art_proxy.journal import rejected

    directory = _rejected_directory(settings)
    try:
        records = rejected.read(directory) if directory.is_dir() else []
    except OSError as exc:
        _fail(str(exc))
    if not records:
        stderr.print(f"no records set aside in {escape(str(directory))}")
        return
    table = Table("call", "trajectory", "seq", "recorded", "bytes")
    for record in records:
        call = record.call
        if call is None:
            table.add_row("(unreadable)", "", "", "", str(len(record.payload)))
            continue
        when = call["created_at"].isoformat(" ", "seconds")
        table.add_row(
            call["id"], call["trajectory_id"], str(call["seq"]), when, str(len(record.payload))
        )
    Console().print(table)
    stderr.print(
        f"{len(records)} set aside in {escape(str(directory / rejected.REJECTED_FILE))}: "
        "art-proxy journal replay puts them in again once the cause is fixed; drop --yes "
        "deletes them"
    )


@settings_command(
    journal_app,
    "replay",
    ReplaySettings,
    "Commit the refused records again; those the store still refuses stay, with its reason.",
)
def journal_replay(settings: ReplaySettings) -> None:
    from art_proxy.journal import rejected
    from art_proxy.store.trajectory_store import TrajectoryStore

    directory = _rejected_directory(settings)

    async def run() -> rejected.Replayed:
        async with TrajectoryStore.opened(settings.store, writer=False) as store:
            return await rejected.replay(directory, store)

    try:
        replayed = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    stderr.print(
        f"{replayed.landed} records put in the store, {len(replayed.refused)} still refused"
    )
    for record, reason in replayed.refused:
        call = record.call
        stderr.print(f"  {escape(call['id'] if call else '(unreadable)')}: {escape(reason)}")


@settings_command(journal_app, "drop", DropSettings, "Delete the refused records (with --yes).")
def journal_drop(settings: DropSettings) -> None:
    from art_proxy.journal import rejected

    directory = _rejected_directory(settings)
    try:
        if not settings.yes:
            count = rejected.count(directory)
            stderr.print(f"{count} records would be dropped for good: pass --yes to drop them")
            return
        dropped = rejected.drop(directory) if directory.is_dir() else 0
    except OSError as exc:
        _fail(str(exc))
    stderr.print(f"dropped {dropped} records")


@settings_command(
    app,
    "lineage",
    LineageSettings,
    "The training steps and adapters that learned from a user's, tenant's or trajectory's records.",
)
def lineage(settings: LineageSettings) -> None:
    from art_proxy.journal.left_behind import opened_for_reading

    async def read() -> Lineage:
        async with opened_for_reading(settings.store) as store:
            return await store.lineage(settings.subject())

    try:
        found = asyncio.run(read())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    _print_lineage(settings.subject().describe(), found)


@settings_command(
    app,
    "forget",
    ForgetSettings,
    "Erase every record of a user, tenant or trajectory (with --yes), and list the training "
    "steps and adapters that learned from them.",
)
def forget(settings: ForgetSettings) -> None:
    from art_proxy.erasure import deleted_text
    from art_proxy.erasure import forget as erase
    from art_proxy.journal.directory import journal_directory, live_slots
    from art_proxy.journal.left_behind import opened_for_reading
    from art_proxy.records import Erasure

    subject = settings.subject()
    directory = journal_directory(settings.journal, settings.store)
    if directory is not None and live_slots(directory):
        _fail(
            f"a proxy is running with the journal {directory}, which may hold the subject's "
            "latest calls: erase through it (POST /art/v1/forget), which erases its journal too"
        )

    async def run() -> Lineage | Erasure:
        # The journal given is taken in first: a stopped proxy's records in it would otherwise
        # come back with the next proxy started on it.
        async with opened_for_reading(settings.store, directory) as store:
            if not settings.yes:
                return await store.lineage(subject)
            return await erase(store, subject, directory)

    try:
        done = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    if isinstance(done, Erasure):
        _print_lineage(subject.describe(), done.lineage)
        stderr.print(
            f"deleted {deleted_text(done.deleted)}; {done.journal_frames_dropped} set-aside "
            "journal records dropped"
        )
        return
    _print_lineage(subject.describe(), done)
    stderr.print(
        f"{len(done.trajectories)} trajectories would be deleted for good, with their calls, "
        "feedback, their groups' judgments and openings: pass --yes to delete them"
    )


@settings_command(
    app,
    "housekeeping",
    HousekeepingSettings,
    "Delete what is older than --retain-days, as a proxy given it does every 10 minutes.",
)
def housekeeping(settings: HousekeepingSettings) -> None:
    from art_proxy.erasure import deleted_text
    from art_proxy.journal.directory import journal_directory
    from art_proxy.journal.left_behind import opened_for_reading
    from art_proxy.retention import expire

    async def run() -> dict[str, int]:
        async with opened_for_reading(settings.store) as store:
            directory = journal_directory(settings.journal, settings.store)
            return await expire(store, settings.retain_days, directory)

    try:
        with stderr.status(f"deleting what is older than {settings.retain_days:g} days..."):
            deleted = asyncio.run(run())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    stderr.print(f"deleted {deleted_text(deleted)}")


def _print_lineage(subject: str, lineage: Lineage) -> None:
    """The subject's steps and the adapters to retrain, on standard output."""
    out = Console(soft_wrap=True)
    out.print(
        f"{escape(subject)}: {len(lineage.trajectories)} trajectories in "
        f"{len(lineage.groups)} groups"
    )
    if not lineage.steps:
        out.print("no training step read them")
        return
    table = Table("run", "step", "kind", "status", "adapter", "groups")
    for step in lineage.steps:
        outcomes = Counter(step.groups.values())
        table.add_row(
            escape(step.run),
            str(step.step),
            step.kind,
            step.status,
            escape(step.adapter or "-"),
            ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items())),
        )
    out.print(table)
    adapters = lineage.derived_adapters
    out.print(
        "adapters that learned from them, to retrain: "
        + (", ".join(escape(adapter) for adapter in adapters) if adapters else "none")
    )


alias_app = typer.Typer(
    help="List, set and reset model aliases: the stable names agents call, and what they serve.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(alias_app, name="alias")


@settings_command(alias_app, "list", AliasListSettings, "Every alias and what it serves.")
def alias_list(settings: AliasListSettings) -> None:
    from art_proxy.store.trajectory_store import TrajectoryStore

    async def read() -> list[AliasRecord]:
        async with TrajectoryStore.opened(settings.store, writer=False) as store:
            return await store.aliases()

    try:
        records = asyncio.run(read())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    if not records:
        stderr.print("no aliases: agents' model names go to the upstream as they are")
        return
    # Plain lines, not a table: names are what a user copies, and a table would cut or fold them.
    for record in records:
        step = "" if record.step is None else f", step {record.step}"
        print(
            f"{record.alias} -> {record.model}{step} (since {record.updated_at:%Y-%m-%d %H:%M} UTC)"
        )


@settings_command(
    alias_app,
    "set",
    AliasSetSettings,
    "Point an alias at a model the upstreams serve (the base, or an adapter they have loaded).",
)
def alias_set(settings: AliasSetSettings) -> None:
    from art_proxy.records import AliasRequest

    request = AliasRequest(model=settings.model, step=settings.step, note=settings.note)
    _move_alias(settings.store, settings.alias, request)


@settings_command(
    alias_app,
    "reset",
    AliasResetSettings,
    "Point an alias back at the base model the upstream serves (after a demo, or a bad run).",
)
def alias_reset(settings: AliasResetSettings) -> None:
    from art_proxy.records import AliasRequest

    try:
        base = asyncio.run(_base_model(settings))
    except ConfigError as exc:
        _fail(str(exc))
    request = AliasRequest(model=base, note="reset to the base model")
    _move_alias(settings.store, settings.alias, request)


async def _base_model(settings: AliasResetSettings) -> str:
    """The base model the first upstream serves; ConfigError when it cannot say which."""
    from art_proxy.proxy.aliases import base_model_of
    from art_proxy.proxy.upstream import Upstreams
    from art_proxy.proxy.upstream_models import served_models

    upstream = settings.upstream[0]
    async with Upstreams(
        [upstream], api_key=settings.upstream_api_key, timeout_s=30.0
    ) as upstreams:
        served = await served_models(upstreams, upstream)
    if isinstance(served, str):
        raise ConfigError(
            f"cannot ask the upstream for its base model ({served}): pass --upstream, or name "
            f"the model with: art-proxy alias set {settings.alias} MODEL"
        )
    base = base_model_of(settings.alias, [served])
    if base is not None:
        return base
    raise ConfigError(
        f"upstream {upstream} serves {len(served.bases)} base models "
        f"({', '.join(served.bases) or 'none'}): name one with: "
        f"art-proxy alias set {settings.alias} MODEL"
    )


def _move_alias(store_url: str, alias: str, request: AliasRequest) -> None:
    from art_proxy.store.trajectory_store import TrajectoryStore

    async def move() -> AliasMove:
        async with TrajectoryStore.opened(store_url, writer=False) as store:
            return await store.set_alias(alias, request)

    try:
        moved = asyncio.run(move())
    except (ConfigError, StoreError, OSError) as exc:
        _fail(str(exc))
    was = f" (was {escape(moved.previous)})" if moved.previous else ""
    stderr.print(
        f"alias {escape(alias)} now serves {escape(moved.model)}{was}; "
        "running proxies follow within a second",
        highlight=False,
    )


@settings_command(
    app,
    "local-llm",
    LocalLlmSettings,
    "Serve a model on CPU behind vLLM's OpenAI API, runtime LoRA included (no GPU, no vLLM).",
)
def local_llm(settings: LocalLlmSettings) -> None:
    from art_proxy.local import missing_local_packages

    missing = missing_local_packages("local-llm")
    if missing is not None:
        _fail(missing)
    # Imported here: torch and transformers load only when this command runs.
    from art_proxy.local.cli import run_local_llm
    from art_proxy.local.errors import ModelLoadError

    _configure_logging()
    try:
        run_local_llm(settings)
    except (ModelLoadError, OSError) as exc:
        _fail(str(exc))


@settings_command(
    app,
    "train",
    TrainSettings,
    "Train a LoRA adapter with GRPO on scored groups and hot-swap it in; with --agent and "
    "--scenarios, run the whole loop (rollouts, rewards, training, swap).",
)
def train(settings: TrainSettings) -> None:
    try:
        from art_proxy_trainer.command import run_follower, run_train
        from art_proxy_trainer.distributed import Ranks, exit_rank
        from art_proxy_trainer.errors import TrainerError
        from art_proxy_trainer.launch import launch_ranks
    except ImportError as exc:
        _fail(f"art-proxy train needs the trainer: pip install art-proxy-trainer ({exc})")
    from art_proxy.local.errors import ModelLoadError
    from art_proxy.ruler.errors import RubricError

    _configure_logging()
    ranks = Ranks.of_environment()
    try:
        if ranks is None and settings.nproc > 1:
            launch_ranks(settings.nproc, sys.argv[1:])  # each rank runs this same command
            return
        if ranks is not None and not ranks.leads:
            # Rank 0 says when to stop (Ctrl-C reaches every rank of the terminal's group).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            run_follower(settings, ranks)
            exit_rank()
        console = Console()
        summary = asyncio.run(run_train(settings, console))
    except (TrainerError, ModelLoadError, RubricError, ConfigError, StoreError, OSError) as exc:
        _fail(str(exc) if ranks is None else f"rank {ranks.rank}: {exc}")
    except RuntimeError as exc:  # torch.distributed's errors: a rank or the network is gone
        if ranks is None:
            raise
        _fail(f"rank {ranks.rank}: {exc}")
    console.print(summary.table())
    if ranks is not None:
        exit_rank()


@settings_command(
    app, "up", UpSettings, "Start the embedded stack: inference server and proxy (Ctrl-C stops)."
)
def up(settings: UpSettings) -> None:
    from art_proxy.up import run_stack

    status = asyncio.run(run_stack(settings))
    if status:
        raise typer.Exit(status)


@settings_command(
    app,
    "rollout",
    RolloutSettings,
    "Run an agent group-size times on every scenario through the proxy, one group per scenario.",
)
def rollout(settings: RolloutSettings) -> None:
    from art_proxy.rollout import load_agent
    from art_proxy.scenarios import load_scenarios

    try:
        scenarios = load_scenarios(settings.scenarios)
        if settings.split is not None:
            scenarios = [s for s in scenarios if s.split == settings.split]
            if not scenarios:
                _fail(f"{settings.scenarios}: no scenarios of split {settings.split}")
        agent = load_agent(settings.agent)
        report = asyncio.run(_rollouts(settings, agent, scenarios))
    except ConfigError as exc:
        _fail(str(exc))
    else:
        _print_rollout_summary(report)
        if report.rollouts and not any(group.succeeded for group in report.groups):
            _fail("no rollout succeeded")


async def _rollouts(
    settings: RolloutSettings, agent: Agent, scenarios: list[Scenario]
) -> RolloutReport:
    from art_proxy.rollout import run_rollouts

    columns = (*Progress.get_default_columns(), MofNCompleteColumn())
    with Progress(*columns, console=stderr, transient=True) as progress:
        bar = progress.add_task("rollouts", total=len(scenarios) * settings.group_size)
        return await run_rollouts(
            agent,
            scenarios,
            proxy_url=settings.proxy,
            group_size=settings.group_size,
            concurrency=settings.concurrency,
            timeout_s=settings.timeout,
            model=settings.model,
            api_key=settings.api_key,
            admin_key=settings.admin_key,
            progress=lambda done, _total: progress.update(bar, completed=done),
        )


def _agent_metrics_table(report: RolloutReport) -> Table | None:
    """The mean of each metric the agent reported, by split (None: it reported none)."""
    names = sorted({name for g in report.groups for m in g.metrics.values() for name in m})
    if not names:
        return None
    table = Table("split", *names, title="agent metrics (mean per rollout that reported it)")
    for split in sorted({group.split for group in report.groups}):
        reported = [m for g in report.groups if g.split == split for m in g.metrics.values()]
        cells = []
        for name in names:
            values = [m[name] for m in reported if name in m]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "-")
        table.add_row(split, *cells)
    return table


# Failures listed under the summary; the rest are counted (each is in the trajectory's metadata).
_LISTED_FAILURES = 5


def _print_rollout_summary(report: RolloutReport) -> None:
    from art_proxy.rollout import ready_for_judging

    table = Table(
        "split",
        "groups",
        "judgeable",
        "rollouts",
        "failed",
        "timed out",
        "mean reward",
        title=f"rollouts in {report.seconds:.1f}s",
    )
    for split in sorted({group.split for group in report.groups}):
        groups = [group for group in report.groups if group.split == split]
        rewards = [r for g in groups for r in g.rewards.values() if r is not None]
        table.add_row(
            split,
            str(len(groups)),
            str(sum(ready_for_judging(group) for group in groups)),
            str(sum(len(group.trajectory_ids) for group in groups)),
            str(sum(len(group.errors) for group in groups)),
            str(sum(len(group.timed_out) for group in groups)),
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
        )
    console = Console()
    console.print(table)
    metrics = _agent_metrics_table(report)
    if metrics is not None:
        console.print(metrics)
    # The agent's error, else why a rollout that returned is not in the store.
    failures = [
        f"{trajectory}: {group.errors.get(trajectory) or group.unrecorded[trajectory]}"
        for group in report.groups
        for trajectory in group.trajectory_ids
        if trajectory in group.errors or trajectory in group.unrecorded
    ]
    for line in failures[:_LISTED_FAILURES]:
        console.print(escape(line), highlight=False, soft_wrap=True)
    if len(failures) > _LISTED_FAILURES:
        console.print(f"... and {len(failures) - _LISTED_FAILURES} more")
    for warning in report.warnings:
        stderr.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)


@settings_command(
    app,
    "eval",
    EvalSettings,
    "Run an agent on held-out scenarios against several models at once (--model each: base, "
    "an adapter, a hosted model) and report each one's reward with its 95% interval, the paired "
    "difference to the first, latency, tokens and cost.",
)
def eval_(settings: EvalSettings) -> None:
    from art_proxy.evaluation.command import evaluate
    from art_proxy.ruler.errors import RubricError

    _configure_logging("warning")
    try:
        report = evaluate(settings, Console(), stderr)
    except (ConfigError, RubricError, StoreError) as exc:
        _fail(str(exc))
    if not any(arm.rollouts > arm.failed for arm in report.arms):
        _fail("no arm completed a rollout")


def main() -> None:
    share_cpu_cores()  # before any command imports torch
    app()


if __name__ == "__main__":  # the ranks of `art-proxy train --nproc N` start this way
    main()
