"""The judge prompt: shared beginning once, each rest under a label, long texts trimmed in the middle."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from art_proxy.records import Feedback, JsonObject
from art_proxy.ruler.errors import PromptTooLong
from art_proxy.ruler.prompt import (
    NO_REST,
    Member,
    build_prompt,
    shared_prefix_length,
    trim_middle,
)
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from tests.ruler.recorded import OPENING, answered


def user_text(messages: list[JsonObject]) -> str:
    return str(messages[1]["content"])


def test_only_messages_every_trajectory_shares_are_shown_once() -> None:
    longer = [*answered("Paris"), {"role": "user", "content": "Sure?"}]
    conversations = [answered("Paris"), longer, answered("Lyon")]
    assert shared_prefix_length(conversations) == len(OPENING)
    prompt = build_prompt(
        [Member(f"id-{i}", c) for i, c in enumerate(conversations)], DEFAULT_RUBRIC, "json"
    )
    text = user_text(prompt.messages)
    assert text.count("What is the capital of France?") == 1
    assert text.index("<shared_beginning>") < text.index('<trajectory id="t1">')
    assert prompt.labels == {"t1": "id-0", "t2": "id-1", "t3": "id-2"}
    assert "[user]\nSure?" in text


def test_a_trajectory_that_is_all_shared_beginning_says_so() -> None:
    prompt = build_prompt(
        [Member("a", answered("Paris")), Member("b", [*answered("Paris"), *OPENING[1:]])],
        DEFAULT_RUBRIC,
        "json",
    )
    assert f'<trajectory id="t1">\n{NO_REST}\n</trajectory>' in user_text(prompt.messages)


def test_the_logprob_prompt_asks_for_one_digit_line_per_label() -> None:
    members = [Member("a", answered("Paris")), Member("b", answered("Lyon"))]
    text = user_text(build_prompt(members, DEFAULT_RUBRIC, "logprob").messages)
    assert text.endswith("t1: <digit>\nt2: <digit>")


def test_users_feedback_is_shown_after_the_trajectory_it_is_about() -> None:
    said = [
        Feedback(id="f1", trajectory_id="a", thumbs="down", created_at=datetime.now(UTC)),
        Feedback(
            id="f2",
            trajectory_id="a",
            score=0.2,
            comment='wrong "city"',
            created_at=datetime.now(UTC),
        ),
    ]
    members = [Member("a", answered("Lyon"), feedback=said), Member("b", answered("Paris"))]
    text = user_text(build_prompt(members, DEFAULT_RUBRIC, "json").messages)
    first, second = text.split('<trajectory id="t2">')
    assert '[user feedback] thumbs down\n[user feedback] score 0.2, "wrong \\"city\\""' in first
    assert "[user feedback]" not in second


def test_trimming_keeps_both_ends_and_says_how_much_went() -> None:
    text = "A" * 50 + "B" * 900 + "C" * 50
    trimmed = trim_middle(text, 100)
    assert trimmed.startswith("A" * 50) and trimmed.endswith("C" * 50)
    assert "[... 900 characters trimmed ...]" in trimmed
    assert trim_middle("short", 100) == "short"


def test_tool_results_are_trimmed_before_anything_else() -> None:
    def conversation(reply: str) -> list[JsonObject]:
        return [
            *OPENING,
            {"role": "assistant", "content": "Let me look. " * 100},
            {"role": "tool", "name": "search", "content": "result " * 2000},
            {"role": "assistant", "content": reply},
        ]

    members = [Member("a", conversation("Paris")), Member("b", conversation("Lyon"))]
    prompt = build_prompt(members, DEFAULT_RUBRIC, "json", max_tokens=1500)
    text = user_text(prompt.messages)
    assert prompt.trimmed and prompt.tokens <= 1500
    assert "Let me look. " * 100 in text  # the assistant's text is whole
    assert "characters trimmed" in text and "[tool result search]" in text


def test_a_group_that_cannot_fit_raises() -> None:
    members = [Member("a", answered("Paris")), Member("b", answered("Lyon"))]
    with pytest.raises(PromptTooLong, match="budget of 10"):
        build_prompt(members, DEFAULT_RUBRIC, "json", max_tokens=10)
