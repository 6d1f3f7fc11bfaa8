"""RULER on the tool agent's GRPO rollouts: does a judge rank them as the task's reward does?

Each GRPO group of the run (8 rollouts of one city, each rewarded 1 or 0 by code) is judged again
by RULER, the bundled SmolLM2 as a logprob judge with the task's rubric (`rubric.txt`, written
from the task, not from the reward's code; logprob mode reads one digit per trajectory, so the
rubric is text, not a checklist). Per group with a reward spread, Kendall's tau-b between
the judge's scores and the rewards: 1 = the judge orders them as the reward does, 0 = no relation.
The judge is asked by its served name on the inference server itself, so it is the base model,
whatever adapter the proxy's alias serves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from art_proxy.config import JudgeSettings
from art_proxy.rewards import has_signal
from art_proxy.ruler.command import build_ruler
from art_proxy.ruler.ensemble import kendall_tau_b
from art_proxy.ruler.rubric import load_rubric
from art_proxy.ruler.run import finished_members
from art_proxy.store.trajectory_store import TrajectoryStore

RUBRIC = Path(__file__).with_name("rubric.txt")


@dataclass(frozen=True)
class Agreement:
    taus: list[float]  # per judged group with a reward spread
    failed: int  # groups the judge could not score
    best_succeeded: int  # groups whose top-scored member had reward 1

    @property
    def mean_tau(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else math.nan


async def ruler_agreement(store_url: str, run: str, llm: str, model: str) -> Agreement:
    store = await TrajectoryStore.open(store_url)
    settings = JudgeSettings(
        store=store_url,
        judge=[f"openai/{model}"],
        judge_base_url=[llm],
        judge_mode="logprob",
        rubric=str(RUBRIC),
    )
    ruler, judges = build_ruler(settings, load_rubric(RUBRIC), store)
    taus: list[float] = []
    failed = best_succeeded = 0
    try:
        for step in await store.training_steps(run=run):
            for group_id, outcome in step.groups.items():
                if step.kind != "grpo" or outcome != "trained":
                    continue
                members = await finished_members(store, group_id)
                rewards = {m.trajectory_id: m.reward for m in members if m.reward is not None}
                if not has_signal(rewards.values()):
                    continue
                judgment = await ruler.score_group(group_id, members)
                scores = {s.trajectory_id: s.score for s in judgment.scores}
                if judgment.status != "scored" or not scores.keys() >= rewards.keys():
                    failed += 1
                    continue
                ids = sorted(rewards)
                taus.append(kendall_tau_b([scores[t] for t in ids], [rewards[t] for t in ids]))
                best_succeeded += rewards[max(ids, key=lambda t: scores[t])] == 1.0
    finally:
        for judge in judges:
            await judge.aclose()
        await store.aclose()
    return Agreement(taus, failed, best_succeeded)
