"""Validation accuracy: the fraction of validation questions the agent answers right.

Runs the agent once on every `val` scenario through the proxy (the project's rollout runner, as the
trainer does) with the model name the proxy serves, and counts the rewards `agent.rollout` reports
(1 for an answer that holds the reference). Run it before and after training: the trainer moves
the alias, so the same name then calls the newest adapter.

    .venv/bin/python -m examples.langgraph_email_agent.evaluate --proxy http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from pathlib import Path

from art_proxy.config import RolloutSettings
from art_proxy.rollout import run_rollouts
from art_proxy.scenarios import load_scenarios
from examples.langgraph_email_agent.agent import rollout

SCENARIOS = Path(__file__).with_name("scenarios.jsonl")


async def accuracy(proxy: str, model: str, concurrency: int, timeout_s: float) -> str:
    """One line: correct / questions, for `model` behind `proxy`."""
    questions = [s for s in load_scenarios(SCENARIOS) if s.split == "val"]
    report = await run_rollouts(
        rollout,
        questions,
        proxy_url=proxy,
        group_size=1,
        concurrency=concurrency,
        timeout_s=timeout_s,
        model=model,
    )
    right = math.fsum(r or 0.0 for g in report.groups for r in g.rewards.values())
    return (
        f"validation accuracy of {model}: {right:g}/{len(questions)} = "
        f"{right / len(questions):.3f} ({report.failed} rollouts failed, {report.seconds:.0f} s)"
    )


def main() -> None:
    # `art-proxy rollout`'s defaults: the local proxy and the bundled model's served name.
    defaults = {name: field.default for name, field in RolloutSettings.model_fields.items()}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # `art-proxy up --run` sets OPENAI_BASE_URL to the proxy's /v1.
    base_url = os.environ.get("OPENAI_BASE_URL", "").removesuffix("/v1")
    parser.add_argument("--proxy", default=base_url or defaults["proxy"])
    parser.add_argument("--model", default=defaults["model"], help="the name agents call")
    parser.add_argument("--concurrency", type=int, default=defaults["concurrency"])
    parser.add_argument("--timeout", type=float, default=defaults["timeout"], help="seconds")
    args = parser.parse_args()
    print(asyncio.run(accuracy(args.proxy, args.model, args.concurrency, args.timeout)))


if __name__ == "__main__":
    main()
