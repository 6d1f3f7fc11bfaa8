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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.vllm_api.engine import PromptError

from .errors import DemonstrationError


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
    marked trained. `end_of_turn`: the token the model ends a turn with (its EOS)."""
    turns = [n for n, message in enumerate(messages) if message.get("role") == "assistant"]
    if not turns:
        raise DemonstrationError("a demonstration needs an assistant turn to learn from")
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
            tokens, trained = tokens + written, trained + [True] * len(written)
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
