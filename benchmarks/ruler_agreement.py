"""RULER agreement: Kendall tau between a judge's scores and a labelled ordering, per group.

Groups are constructed and shipped here: one task, four endings whose order by the default rubric
is known (goal reached directly > reached with detours > partial progress > failure). Each group
goes through the real path (`Ruler`, a throwaway SQLite store, the judge over HTTP), and the
figure is the mean Kendall tau-b over the groups: 1 = the labelled order, 0 = no relation, -1 =
reversed. A judge that fails a group counts as 0 for it. Beside it, the mean Kendall tau-b between
the scores and the positions the trajectories were shown at (first order): a judge that scores by
place has it near 1 with one order; `--orders 1,2` measures RULER's position debiasing
(`--judge-orders`) side by side. With 2 or more orders, the judge check's figures
(ruler/check.py, `art-proxy judge --check`): the tau between the orders' rankings, and whether
the check passes the judge.

    .venv/bin/python benchmarks/ruler_agreement.py --local          # bundled SmolLM2, logprob mode
    .venv/bin/python benchmarks/ruler_agreement.py --judge openai/MODEL --judge-base-url URL

The last line is the key figure.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from art_proxy.config.judge import JudgeChoice
from art_proxy.records import JsonObject, JudgeMode, Judgment
from art_proxy.ruler.check import JudgeCheck, check_judgments
from art_proxy.ruler.ensemble import kendall_tau_b
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.prompt import Member
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.rows import GroupRow, RowKind, ScenarioRow
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch

# The judge check's threshold (`--judge-check-below`), as `train` and `judge --check` default it.
DEFAULT_CHECK_BELOW = JudgeChoice.model_fields["judge_check_below"].default


@dataclass(frozen=True)
class LabelledGroup:
    task: str
    endings: Sequence[Sequence[JsonObject]]  # best first


def _say(text: str) -> JsonObject:
    return {"role": "assistant", "content": text}


def _call(name: str, arguments: str, result: str, index: int) -> list[JsonObject]:
    call = {
        "id": f"c{index}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{index}", "name": name, "content": result},
    ]


GROUPS = (
    LabelledGroup(
        "What is 17 * 23?",
        [
            [_say("17 * 23 = 391.")],
            [_say("17 * 20 = 340, 17 * 3 = 51, and 340 + 51 = 391. Let me double-check: 391.")],
            [_say("17 * 20 = 340, so the answer is a bit more than 340.")],
            [_say("17 * 23 = 401.")],
        ],
    ),
    LabelledGroup(
        "What is the capital of Australia?",
        [
            [_say("Canberra.")],
            [_say("Many think Sydney, but the capital of Australia is Canberra.")],
            [_say("It is not Sydney; I am not sure which city it is.")],
            [_say("Sydney.")],
        ],
    ),
    LabelledGroup(
        "What is the weather in Paris right now? Use the tools.",
        [
            [*_call("get_weather", '{"city": "Paris"}', "18 C, sunny", 1), _say("18 C, sunny.")],
            [
                *_call("get_weather", '{"city": "Pari"}', "error: unknown city", 1),
                *_call("get_weather", '{"city": "Paris"}', "18 C, sunny", 2),
                _say("18 C and sunny in Paris."),
            ],
            [*_call("get_weather", '{"city": "Pari"}', "error: unknown city", 1), _say("Unknown.")],
            [_say("It is probably raining in Paris.")],
        ],
    ),
    LabelledGroup(
        "Translate 'good morning' into French.",
        [
            [_say("Bonjour.")],
            [_say("In French, 'good morning' is usually just 'bonjour' (literally 'good day').")],
            [_say("'Bon' means 'good' in French.")],
            [_say("Buenos dias.")],
        ],
    ),
    LabelledGroup(
        "Sort these numbers ascending: 5, 2, 9, 1.",
        [
            [_say("1, 2, 5, 9")],
            [_say("First 1 is smallest, then 2, then 5, then 9: 1, 2, 5, 9")],
            [_say("1, 2, ... I am not sure about the rest.")],
            [_say("9, 5, 2, 1")],
        ],
    ),
    LabelledGroup(
        "How many files are in /data? Use the tools.",
        [
            [*_call("list_dir", '{"path": "/data"}', '["a.csv", "b.csv"]', 1), _say("2 files.")],
            [
                *_call("list_dir", '{"path": "/"}', '["data", "home"]', 1),
                *_call("list_dir", '{"path": "/data"}', '["a.csv", "b.csv"]', 2),
                _say("There are 2 files in /data."),
            ],
            [*_call("list_dir", '{"path": "/"}', '["data", "home"]', 1), _say("There is /data.")],
            [_say("There are 10 files.")],
        ],
    ),
)


async def agreement(
    client: LitellmJudge, mode: JudgeMode, budget: int, orders: int = 1
) -> tuple[list[tuple[float, float]], JudgeCheck]:
    """Per group, in the order of GROUPS: the tau with the labelled order, and with the
    positions shown (0 and 0 for a group the judge fails); and the judge check of the
    judgments, the labels as the known rewards."""
    taus: list[tuple[float, float]] = []
    judgments: list[Judgment] = []
    known: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        store = await TrajectoryStore.open(f"sqlite:///{Path(folder) / 'agreement.db'}")
        try:
            settings = RulerSettings(DEFAULT_RUBRIC, mode, budget, orders=orders)
            ruler = Ruler(client, store, settings)
            for index, group in enumerate(GROUPS):
                opening = [{"role": "user", "content": group.task}]
                # Shown in a scrambled order, so a judge that favours position gains nothing.
                order = [2, 0, 3, 1]
                members = [
                    Member(f"g{index}-rank{rank}", [*opening, *group.endings[rank]])
                    for rank in order
                ]
                judgment = await ruler.score_group(await _group(store, index), members)
                judgments.append(judgment)
                known |= {f"g{index}-rank{rank}": -float(rank) for rank in order}
                if judgment.status != "scored":
                    print(f"group {index}: {judgment.status}: {judgment.reason}")
                    taus.append((0.0, 0.0))
                    continue
                by_id = {score.trajectory_id: score.score for score in judgment.scores}
                scores = [by_id[member.trajectory_id] for member in members]
                labelled = kendall_tau_b(scores, [-float(rank) for rank in order])
                placed = kendall_tau_b(scores, [float(shown) for shown in range(len(order))])
                taus.append((labelled, placed))
                print(
                    f"group {index}, {orders} order(s): tau {labelled:+.2f} with the labels, "
                    f"{placed:+.2f} with the positions  ({group.task})"
                )
        finally:
            await store.aclose()
    return taus, check_judgments(judgments, known, DEFAULT_CHECK_BELOW)


async def _group(store: TrajectoryStore, index: int) -> str:
    """A group row for the judgment to belong to (its trajectories need not be stored)."""
    now = utcnow()
    scenario: ScenarioRow = {
        "id": f"agreement-{index}",
        "created_at": now,
        "auto": False,
        "opening": [],
    }
    group: GroupRow = {"id": f"g{index}", "scenario_id": scenario["id"], "created_at": now}
    await store.write(Batch([(RowKind.scenario, scenario), (RowKind.group, group)]))
    return group["id"]


@asynccontextmanager
async def bundled_judge() -> AsyncIterator[tuple[str, str]]:
    """SmolLM2-135M served by local-llm in this process: (model, base URL)."""
    from art_proxy.local.model_loading import load_model
    from art_proxy.local.served import ServedModel
    from art_proxy.local.server import running_local_llm

    served = ServedModel.create(load_model(None), max_model_len=2048, max_batch_size=4)
    async with running_local_llm(served, "127.0.0.1", 0) as local:
        yield f"openai/{served.name}", local.base_url


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="judge with the bundled SmolLM2")
    parser.add_argument("--judge", help="litellm model name, e.g. openai/MODEL")
    parser.add_argument("--judge-base-url", help="OpenAI-compatible base URL ending in /v1")
    parser.add_argument("--mode", choices=["json", "logprob"], help="default: logprob with --local")
    parser.add_argument("--max-prompt-tokens", type=int, default=1500)
    parser.add_argument(
        "--orders",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1],
        help="comma-separated orders each group is shown in, one run each (e.g. 1,2)",
    )
    args = parser.parse_args()
    if args.local == bool(args.judge):
        parser.error("give either --local or --judge")
    mode: JudgeMode = args.mode or ("logprob" if args.local else "json")
    figures = []
    async with _judge(args) as (model, base_url):
        client = LitellmJudge(model, base_url=base_url)
        try:
            await client.check()  # reads the judge's context, which prompts are fitted to
            for orders in args.orders:
                taus, check = await agreement(client, mode, args.max_prompt_tokens, orders)
                labelled = sum(t for t, _ in taus) / len(taus)
                placed = sum(p for _, p in taus) / len(taus)
                figure = f"{orders} order(s): {labelled:+.2f} labels, {placed:+.2f} position"
                if check.consistency is not None:
                    verdict = "passes" if check.passed else "fails"
                    figure += f", orders agree {check.consistency:+.2f} (check {verdict})"
                    print(check.line())
                figures.append(figure)
        finally:
            await client.aclose()
    print(f"mean Kendall tau of {model} ({mode}) over {len(GROUPS)} groups: " + "; ".join(figures))


@asynccontextmanager
async def _judge(args: argparse.Namespace) -> AsyncIterator[tuple[str, str | None]]:
    if args.local:
        async with bundled_judge() as (model, base_url):
            yield model, base_url
    else:
        yield args.judge, args.judge_base_url


if __name__ == "__main__":
    asyncio.run(main())
