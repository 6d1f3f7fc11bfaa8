"""One round of simulated production: users ask, the app rates what they got, the candidate is
validated.

A user is the plain OpenAI SDK, configured by `OPENAI_BASE_URL` alone, asking the model `assistant`
a question that wants a one-word answer (examples/single_word's `ask`). The proxy files the call as
`prod` and, after answering, samples it again (shadow sampling): the served answer and its samples
are one group. The app around the agent then finishes each conversation and posts its user's
feedback: thumbs and, as score, the single-word reward (`as_reward`). It knows a conversation by the
completion id its user got; a real app would name its conversations itself (`X-Art-Trajectory`).

The rater stands in for RULER: each shadow sample gets the single-word reward of its own text, set
at finish (keeping the proxy's `shadow_of` metadata, since a finish replaces the metadata). In a
deployment `art-proxy judge --watch` scores the shadow groups instead, with the users' feedback
shown to the judge.

Validation runs examples/single_word's rollout on the `val` questions against the candidate alias;
those groups reach the trainer with the next step and give the validation reward that safe
promotion compares.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from openai import AsyncOpenAI

from art_proxy.records import FeedbackRequest, FinishRequest, TrainingStep
from art_proxy.rewards import has_signal, mean_or_nan
from art_proxy.rollout import run_rollouts
from art_proxy.scenarios import Scenario
from examples.single_word.agent import ask, rate, rollout

from .api import ArtApi
from .stack import CANDIDATE_ALIAS, PROD_ALIAS, RUN

# A round's shadow samples are recorded within seconds; past this the round goes on without them.
_SHADOW_WAIT_S = 120.0
_POLL_S = 0.25
_ROLLOUT_TIMEOUT_S = 120.0


@dataclass
class Conversation:
    question: str
    completion_id: str
    reward: float
    trajectory_id: str | None = None  # None: the app never found it in the store
    group_id: str | None = None


@dataclass
class RoundReport:
    number: int
    conversations: list[Conversation]
    shadow_samples: int = 0  # rated by the rater
    shadow_failed: int = 0  # recorded failed: nothing to rate
    feedback: int = 0
    val_reward: float = math.nan  # the candidate's, on the val questions
    group_ids: list[str] = field(default_factory=list)  # prod and val groups, for the trainer
    steps: int = 0  # trainer steps by the end of the round
    serving: str = ""  # what the production alias served at the end of the round

    @property
    def prod_reward(self) -> float:
        return mean_or_nan([c.reward for c in self.conversations])


async def ask_as_user(client: AsyncOpenAI, question: str) -> Conversation:
    reply = await ask(client, PROD_ALIAS, question)
    choice = reply.choices[0]
    return Conversation(question, reply.id, rate(choice.message.content, choice.finish_reason))


async def settle_shadows(api: ArtApi, samples: int) -> None:
    """Wait until every shadowed call's samples are recorded (the proxy counts both)."""
    deadline = time.monotonic() + _SHADOW_WAIT_S
    while time.monotonic() < deadline:
        health = await api.health()
        if health["shadow_samples"] >= health["shadow_calls"] * samples:
            return
        await asyncio.sleep(_POLL_S)


async def finish_with_feedback(api: ArtApi, conversations: Sequence[Conversation]) -> int:
    """Find each conversation's trajectory, finish it, post its user's feedback; how many got
    feedback."""
    by_completion: dict[str, tuple[str, str]] = {}
    for summary in await api.trajectories(split="prod", status="open"):
        whole = await api.trajectory(summary.id)
        if whole.calls and whole.calls[0].response:
            by_completion[str(whole.calls[0].response.get("id"))] = (whole.id, whole.group_id)
    given = 0
    for conversation in conversations:
        found = by_completion.get(conversation.completion_id)
        if found is None:
            continue
        conversation.trajectory_id, conversation.group_id = found
        await api.finish(conversation.trajectory_id, FinishRequest())
        await api.feedback(
            FeedbackRequest(
                trajectory_id=conversation.trajectory_id,
                score=conversation.reward,
                thumbs="up" if conversation.reward == 1.0 else "down",
                comment=None if conversation.reward == 1.0 else "I asked for a single word.",
                as_reward=True,
            )
        )
        given += 1
    return given


async def rate_shadows(api: ArtApi, group_ids: Sequence[str]) -> tuple[int, int]:
    """The rater's reward for every unrated shadow sample of these groups: (rated, failed)."""
    rated = failed = 0
    for group_id in group_ids:
        for member in await api.trajectories(group=group_id):
            if member.finish_reason != "shadow" or member.reward is not None:
                continue
            calls = (await api.trajectory(member.id)).calls or []
            if not calls or calls[0].status != "ok" or not calls[0].response:
                failed += 1
                continue
            choice = calls[0].response["choices"][0]
            score = rate(choice["message"].get("content"), choice["finish_reason"])
            await api.finish(member.id, FinishRequest(reward=score, metadata=member.metadata))
            rated += 1
    return rated, failed


async def validate(
    api: ArtApi, scenarios: Sequence[Scenario], samples: int
) -> tuple[float, list[str]]:
    """The candidate's mean reward on the val questions, and their groups."""
    report = await run_rollouts(
        rollout,
        scenarios,
        proxy_url=api.root,
        group_size=samples,
        concurrency=8,
        timeout_s=_ROLLOUT_TIMEOUT_S,
        model=CANDIDATE_ALIAS,
    )
    rewards = [r for g in report.groups for r in g.rewards.values() if r is not None]
    return mean_or_nan(rewards), [g.group_id for g in report.groups]


async def trainer_caught_up(
    api: ArtApi, group_ids: Sequence[str], groups_per_step: int, timeout_s: float
) -> list[TrainingStep]:
    """Wait (at most `timeout_s`) until the trainer has taken all it can of these groups: fewer
    than a step's worth that it could train on are left unconsumed. Returns the run's steps."""
    deadline = time.monotonic() + timeout_s
    while True:
        steps = await api.training_steps(RUN)
        consumed = {group for step in steps for group in step.groups}
        trainable = 0
        for group_id in group_ids:
            if group_id in consumed:
                continue
            members = await api.trajectories(group=group_id)
            if not members or members[0].split == "val":
                continue
            if any(m.status == "open" for m in members):
                continue  # the trainer takes a group once every member is finished
            rewards_G = [m.reward for m in members if m.reward is not None]
            trainable += has_signal(rewards_G)
        if trainable < groups_per_step or time.monotonic() > deadline:
            return steps
        await asyncio.sleep(_POLL_S)


async def run_round(
    api: ArtApi,
    number: int,
    questions: Sequence[str],
    val_scenarios: Sequence[Scenario],
    *,
    shadow_samples: int,
    val_samples: int,
    status: Callable[[str], None],
) -> RoundReport:
    status(f"round {number}: {len(questions)} users ask {PROD_ALIAS!r}")
    client = AsyncOpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    async with client:
        conversations = await asyncio.gather(*(ask_as_user(client, q) for q in questions))
    report = RoundReport(number, list(conversations))
    status(f"round {number}: waiting for the shadow samples")
    await settle_shadows(api, shadow_samples)
    status(f"round {number}: finishing conversations, users' feedback, rating shadow samples")
    report.feedback = await finish_with_feedback(api, report.conversations)
    report.group_ids = sorted({c.group_id for c in report.conversations if c.group_id})
    report.shadow_samples, report.shadow_failed = await rate_shadows(api, report.group_ids)
    status(f"round {number}: validating {CANDIDATE_ALIAS!r}")
    report.val_reward, val_groups = await validate(api, val_scenarios, val_samples)
    report.group_ids += val_groups
    return report
