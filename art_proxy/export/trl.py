"""`art-proxy export --format trl`: the recorded calls in TRL's conversational dataset formats.

Without `--pairs`, a row per sampled choice of every call: `prompt` (the messages the call sent),
`completion` (the assistant message it got back, a list of one), `tools` where the call offered
tools, and for learning from it the trajectory's `reward` (RULER's judged reward where its group
was judged, else the agent's or a user's), its `advantage` (the reward less its group's mean: the
GRPO advantage, unscaled, as art-proxy's trainer computes it by default) and `label` (the advantage
is positive: what TRL's KTOTrainer reads). `trl.data_utils.is_conversational` holds for every row
of a chat call, so SFTTrainer, KTOTrainer and the GRPO family read them as they are; a legacy
completions call keeps its `prompt` and `completion` as text (TRL's standard format).

With `--kto`, KTOTrainer's rows only, as it reads them: `prompt`, `completion` and `label`, of
answered calls whose trajectory's advantage is not 0 (a reward, in a group whose rewards differ).

With `--pairs`, preference pairs for DPOTrainer: within each group whose rewards differ, every
prompt that trajectories of different rewards sent alike (the scenario's opening, at least) gives
one row, `chosen` the reply of the best of them and `rejected` that of the worst, where the
replies differ. Failed calls are in the rows (`call_status`, `error`) but never in a pair.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from art_proxy.records import CallRecord, ExportedTrajectory, JsonObject
from art_proxy.rewards import mean_or_nan

Reader = Callable[[], AsyncIterable[ExportedTrajectory]]

# The keys of an assistant message TRL's chat templates read; the rest (null fields, vLLM's
# reasoning) stay in the store.
_MESSAGE_KEYS = ("role", "content", "tool_calls")


def reward_of(exported: ExportedTrajectory) -> float | None:
    """What a trajectory is ranked by: RULER's judged reward, else the agent's or a user's."""
    judged = exported.judged_reward
    return judged if judged is not None else exported.trajectory.reward


async def write_trl(read: Reader, out: IO[str], *, pairs: bool, kto: bool = False) -> int:
    """The rows (or with `pairs` the preference pairs, with `kto` KTO's rows) of the
    trajectories `read` yields, one JSON object a line; how many rows. `read` is called twice:
    the first pass learns each group's rewards (an advantage needs its group's mean), the
    second writes."""
    rewards: dict[str, dict[str, float]] = {}
    async for exported in read():
        reward = reward_of(exported)
        if reward is not None:
            rewards.setdefault(exported.trajectory.group_id, {})[exported.trajectory.id] = reward
    means = {group: mean_or_nan(list(members.values())) for group, members in rewards.items()}
    if pairs:
        return await _write_pairs(read, out, means)
    count = 0
    async for exported in read():
        for row in _rows(exported, means):
            if kto:
                # KTOTrainer reads every row's label and completion: a row without either (no
                # reward, a tie, no answer) would stop it, and the rest it does not read.
                if not row["advantage"] or row["completion"] is None:
                    continue
                row = {key: row[key] for key in ("prompt", "completion", "label")}
            out.write(orjson.dumps(row).decode() + "\n")
            count += 1
    return count


def _rows(exported: ExportedTrajectory, means: dict[str, float]) -> Iterator[JsonObject]:
    trajectory = exported.trajectory
    reward = reward_of(exported)
    mean = means.get(trajectory.group_id)
    advantage = None if reward is None or mean is None else reward - mean
    for call in trajectory.calls or []:
        replies: list[JsonObject | None] = [*_replies(call)] or [None]
        for choice, reply in enumerate(replies):
            row: JsonObject = {
                "prompt": _prompt(call),
                "completion": _completion(call, reply),
                "reward": reward,
                "advantage": advantage,
                "label": None if advantage is None else advantage > 0,
                "trajectory_id": trajectory.id,
                "group_id": trajectory.group_id,
                "scenario_id": trajectory.scenario_id,
                "split": trajectory.split,
                "call_id": call.id,
                "seq": call.seq,
                "choice": choice,
                "model": call.model,
                "trainable": call.trainable,
                "call_status": call.status,
                "error": call.error,
            }
            tools = call.request.get("tools")
            if isinstance(tools, list) and tools:
                row["tools"] = tools
            yield row


@dataclass
class _Candidate:
    reward: float
    reply: JsonObject
    trajectory_id: str


@dataclass
class _Prompt:
    """One prompt of a group, and the best and worst replies trajectories gave it."""

    group_id: str
    scenario_id: str
    messages: list[JsonObject]
    tools: list[Any] | None
    best: _Candidate
    worst: _Candidate


async def _write_pairs(read: Reader, out: IO[str], means: dict[str, float]) -> int:
    prompts: dict[bytes, _Prompt] = {}
    async for exported in read():
        trajectory = exported.trajectory
        reward = reward_of(exported)
        if reward is None or trajectory.group_id not in means:
            continue
        for call in trajectory.calls or []:
            replies = _replies(call)
            if call.kind != "chat" or call.status != "ok" or not replies:
                continue
            messages = call.request.get("messages")
            if not isinstance(messages, list):
                continue
            tools = (
                call.request.get("tools") if isinstance(call.request.get("tools"), list) else None
            )
            key = orjson.dumps([trajectory.group_id, messages, tools], option=orjson.OPT_SORT_KEYS)
            candidate = _Candidate(reward, replies[0], trajectory.id)
            seen = prompts.get(key)
            if seen is None:
                prompts[key] = _Prompt(
                    trajectory.group_id,
                    trajectory.scenario_id,
                    messages,
                    tools,
                    candidate,
                    candidate,
                )
            elif reward > seen.best.reward:
                seen.best = candidate
            elif reward < seen.worst.reward:
                seen.worst = candidate
    count = 0
    for prompt in prompts.values():
        best, worst = prompt.best, prompt.worst
        if best.reward <= worst.reward or _said(best.reply) == _said(worst.reply):
            continue
        row: JsonObject = {
            "prompt": prompt.messages,
            "chosen": [best.reply],
            "rejected": [worst.reply],
            "chosen_reward": best.reward,
            "rejected_reward": worst.reward,
            "chosen_trajectory_id": best.trajectory_id,
            "rejected_trajectory_id": worst.trajectory_id,
            "group_id": prompt.group_id,
            "scenario_id": prompt.scenario_id,
        }
        if prompt.tools:
            row["tools"] = prompt.tools
        out.write(orjson.dumps(row).decode() + "\n")
        count += 1
    return count


def _said(reply: JsonObject) -> tuple[Any, ...]:
    """What a reply says: its text and the functions it calls with their arguments, without the
    ids the server made up (two replies that call one tool alike are the same answer)."""
    calls = reply.get("tool_calls") or []
    functions = [c.get("function") for c in calls if isinstance(c, dict)]
    return (reply.get("content") or "", orjson.dumps(functions, option=orjson.OPT_SORT_KEYS))


def _prompt(call: CallRecord) -> Any:
    """The messages a chat call sent (conversational), or a completions call's prompt text."""
    return call.request.get("messages") if call.kind == "chat" else call.request.get("prompt")


def _replies(call: CallRecord) -> list[JsonObject]:
    """Each choice's reply: the assistant message as TRL's templates read it, or a completions
    call's text as `{"text": ...}`."""
    choices = (call.response or {}).get("choices")
    if not isinstance(choices, list):
        return []
    replies: list[JsonObject] = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        if call.kind == "completion":
            replies.append({"text": choice.get("text") or ""})
            continue
        message = choice.get("message")
        if isinstance(message, dict):
            kept = {key: message[key] for key in _MESSAGE_KEYS if message.get(key) is not None}
            kept.setdefault("role", "assistant")
            kept.setdefault("content", "")
            replies.append(kept)
    return replies


def _completion(call: CallRecord, reply: JsonObject | None) -> Any:
    """A chat call's reply as a conversation of one message, a completions call's as its text;
    None for a call that got no answer."""
    if reply is None:
        return None
    return reply.get("text") if call.kind == "completion" else [reply]
