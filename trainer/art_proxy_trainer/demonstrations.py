"""Demonstrations for a warm start: a conversation (an agent's messages, its tool calls, the tool
results and its answers) as the tokens the served model would see and write, and which of them
to learn.

RL cannot start from a behaviour the model never shows (SmolLM2-135M calls a tool in 0 of 64
LangGraph rollouts): a warm start first fine-tunes the adapter on demonstrations. They must be
rendered exactly as the server renders the conversation, or the adapter learns tokens it will
never be shown: the chat renderer is local-llm's (the model's own template, tools described in
the Hermes format where the template has no place for them, earlier tool calls rendered back as
that markup), and each assistant turn is taken where the rendering of the conversation so far
leaves off, through the end-of-turn token the model stops on. Prompts, tool results and every
other turn stay out of the loss; the assistant's text and tool calls are in it.

Where they come from: a JSONL file in OpenAI's chat fine-tuning format (`messages`, optional
`tools`, an assistant message with `"weight": 0` rendered but not learnt; an `art-proxy export`
line reads the same), or the store's finished trajectories (a hosted model's, recorded as text).
A trajectory the trained model itself served carries the exact token ids it was shown and wrote:
those are used as they are, never re-rendered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.records import CallRecord, ExportedTrajectory
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.vllm_api.engine import PromptError
from art_proxy_trainer.batch import TrainingSequence, sequences_from_calls

from .errors import DemonstrationError


@dataclass(frozen=True)
class Demonstration:
    source: str  # where it was read: `file.jsonl:3`, `trajectory <id>`
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    # The calls of a trajectory this model served, whose token ids are used as they are.
    served: Sequence[CallRecord] = ()


@dataclass(frozen=True)
class StoreDemonstrations:
    """Which of the store's finished trajectories are demonstrations."""

    scenarios: Sequence[str] = ()  # empty: every scenario
    split: str | None = "train"
    min_reward: float | None = None  # the reward the agent reported at finish
    model: str | None = None  # the model that served them (a call's `model`); None: any


@dataclass(frozen=True)
class RenderedDemonstration:
    tokens: list[int]
    trained: list[bool]  # per token: part of an assistant turn (text, tool calls, end of turn)

    @property
    def trained_tokens(self) -> int:
        return sum(self.trained)


def render_demonstration(
    renderer: ChatRenderer,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    end_of_turn: int,
) -> RenderedDemonstration:
    """The conversation's tokens up to the end of its last assistant turn, each assistant turn
    marked trained unless it carries `"weight": 0`. `end_of_turn`: the token the model ends a
    turn with (its EOS)."""
    turns = [n for n, message in enumerate(messages) if message.get("role") == "assistant"]
    learnt = [n for n in turns if messages[n].get("weight", 1) != 0]
    if not learnt:
        raise DemonstrationError("a demonstration needs an assistant turn to learn from")
    messages = [{k: v for k, v in message.items() if k != "weight"} for message in messages]
    turns = [n for n in turns if n <= learnt[-1]]
    tokens: list[int] = []
    trained: list[bool] = []
    try:
        for turn in turns:
            prompt = _extending(tokens, renderer.render(messages[:turn], tools), turn)
            trained += [False] * (len(prompt) - len(tokens))
            tokens = prompt
            opened = _extending(
                tokens, renderer.render(messages[: turn + 1], tools, continue_final=True), turn
            )
            written = [*opened[len(tokens) :], end_of_turn]
            tokens, trained = tokens + written, trained + [turn in learnt] * len(written)
        # The turn as written must be what the template renders once the conversation goes on.
        _extending(tokens, renderer.render(messages[: turns[-1] + 1], tools), turns[-1])
    except PromptError as exc:
        raise DemonstrationError(str(exc)) from exc
    return RenderedDemonstration(tokens, trained)


def _extending(tokens: list[int], rendered: list[int], turn: int) -> list[int]:
    if rendered[: len(tokens)] != tokens:
        raise DemonstrationError(
            f"the chat template renders the turns before message {turn} differently once it "
            "follows them: the conversation cannot be trained as one sequence"
        )
    return rendered


def demonstration_sequences(
    demonstration: Demonstration, renderer: ChatRenderer, end_of_turn: int
) -> list[TrainingSequence]:
    """What a warm start learns of one demonstration: its served token ids where it has them
    (every sampled token learnt), else its conversation rendered."""
    if demonstration.served:
        stitched, _ = sequences_from_calls(demonstration.source, demonstration.served)
        if stitched:
            return [
                _demonstrated(demonstration.source, recorded.tokens, recorded.mask)
                for recorded in stitched
            ]
    try:
        rendered = render_demonstration(
            renderer, demonstration.messages, demonstration.tools, end_of_turn
        )
    except DemonstrationError as exc:
        raise DemonstrationError(f"{demonstration.source}: {exc}") from exc
    return [_demonstrated(demonstration.source, rendered.tokens, rendered.trained)]


def _demonstrated(
    source: str, tokens: Sequence[int], trained: Sequence[bool | int]
) -> TrainingSequence:
    """A sequence whose `trained` tokens are learnt as demonstrated, the others context."""
    sequence = TrainingSequence(source)
    for token, learnt in zip(tokens, trained, strict=True):
        if learnt:
            sequence.add_demonstrated([token])
        else:
            sequence.add_context([token])
    return sequence


def read_demonstrations(path: Path) -> list[Demonstration]:
    """A JSONL file of conversations (OpenAI's chat fine-tuning format, or `art-proxy export`
    lines); raises DemonstrationError naming the line that is not one."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DemonstrationError(f"cannot read demonstrations from {path}: {exc}") from exc
    demonstrations = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        source = f"{path.name}:{number}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DemonstrationError(f"{source}: not JSON ({exc.msg})") from exc
        messages = entry.get("messages") if isinstance(entry, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise DemonstrationError(f"{source}: needs 'messages', a list of message objects")
        tools = entry.get("tools")
        if tools is None and isinstance(entry.get("trajectory"), dict):
            calls = entry["trajectory"].get("calls") or []
            tools = _last_tools([c.get("request") for c in calls if isinstance(c, dict)])
        if tools is not None and not isinstance(tools, list):
            raise DemonstrationError(f"{source}: 'tools' must be a list")
        demonstrations.append(Demonstration(source, messages, tools))
    if not demonstrations:
        raise DemonstrationError(f"{path} holds no demonstration")
    return demonstrations


def _last_tools(requests: Sequence[Any]) -> list[dict[str, Any]] | None:
    """The tools the last chat request offered (a chat request has `messages`)."""
    for request in reversed(requests):
        if isinstance(request, dict) and request.get("messages") is not None:
            tools = request.get("tools")
            return tools if isinstance(tools, list) else None
    return None


async def stored_demonstrations(
    store: TrajectoryStore, chosen: StoreDemonstrations, served_here: Callable[[str], bool]
) -> list[Demonstration]:
    """The store's finished trajectories that `chosen` picks, oldest first. `served_here`: whether
    a call's served model is the trained model (its token ids are then used as they are)."""
    demonstrations = []
    scenarios: Sequence[str | None] = list(chosen.scenarios) or [None]
    for scenario in scenarios:
        async for exported in store.export(
            scenario=scenario, status="finished", split=chosen.split
        ):
            demonstration = _stored(exported, chosen, served_here)
            if demonstration is not None:
                demonstrations.append(demonstration)
    return demonstrations


def _stored(
    exported: ExportedTrajectory, chosen: StoreDemonstrations, served_here: Callable[[str], bool]
) -> Demonstration | None:
    trajectory = exported.trajectory
    calls = [call for call in trajectory.calls or [] if call.status == "ok"]
    if not calls or not any(m.get("role") == "assistant" for m in exported.messages):
        return None
    if chosen.min_reward is not None and (
        trajectory.reward is None or trajectory.reward < chosen.min_reward
    ):
        return None
    if chosen.model is not None and not any(call.model == chosen.model for call in calls):
        return None
    served = all(
        call.model is not None and served_here(call.model) and call.prompt_token_ids is not None
        for call in calls
    )
    tools = _last_tools([call.request for call in calls])
    return Demonstration(
        f"trajectory {trajectory.id}", exported.messages, tools, calls if served else ()
    )
