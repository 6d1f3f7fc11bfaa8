"""Demonstrations for a warm start, rendered as the server renders them: the assistant's text and
tool calls in the loss, the prompts and tool results out (SmolLM2's template, whose tools local-llm
describes in the Hermes format)."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import model_files
from art_proxy_trainer.demonstrations import render_demonstration
from art_proxy_trainer.errors import DemonstrationError

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "The code word of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Answer with the code word the lookup tool gives."},
    {"role": "user", "content": "What is the code word of Lima?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call-1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"city": "Lima"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call-1", "content": "quetzal-41"},
    {"role": "assistant", "content": "The code word is quetzal-41."},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_files(None).directory, local_files_only=True)


def spans(tokenizer: PreTrainedTokenizerBase, tokens: list[int], trained: list[bool]) -> list[str]:
    """The text of each run of trained (or untrained) tokens, in order."""
    runs: list[tuple[bool, list[int]]] = []
    for token, flag in zip(tokens, trained, strict=True):
        if runs and runs[-1][0] == flag:
            runs[-1][1].append(token)
        else:
            runs.append((flag, [token]))
    return [f"{'+' if flag else '-'}{tokenizer.decode(ids)}" for flag, ids in runs]


def test_the_assistants_tool_calls_and_answer_are_trained_and_the_rest_is_not(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    renderer = ChatRenderer(tokenizer)
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    rendered = render_demonstration(renderer, CONVERSATION, TOOLS, eos)
    parts = spans(tokenizer, rendered.tokens, rendered.trained)
    assert [part[0] for part in parts] == ["-", "+", "-", "+"]
    prompt, call, result, answer = parts
    assert "code word of Lima" in prompt and '"name": "lookup"' in prompt  # the tools, described
    assert call.startswith("+<tool_call>") and '"city": "Lima"' in call
    assert call.endswith("</tool_call><|im_end|>")
    assert "quetzal-41" in result and "<tool_call>" not in result  # the tool's result: not learnt
    assert answer == "+The code word is quetzal-41.<|im_end|>"
    # What the server renders for the conversation going on starts with exactly these tokens.
    going_on = renderer.render(CONVERSATION, TOOLS)
    assert going_on[: len(rendered.tokens)] == rendered.tokens
    assert rendered.trained_tokens == sum(len(tokenizer.encode(p[1:])) for p in (call, answer))


def test_a_conversation_without_an_assistant_turn_is_refused(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    with pytest.raises(DemonstrationError, match="assistant turn"):
        render_demonstration(ChatRenderer(tokenizer), CONVERSATION[:2], TOOLS, 0)
