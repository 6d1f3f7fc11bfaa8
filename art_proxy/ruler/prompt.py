"""The judge's prompt for one group: the shared beginning once, each trajectory's rest, the rubric.

Trajectories of one group start alike (system prompt, task, often the first turns), so showing that
beginning once makes one call per group far cheaper than a call per trajectory
(`benchmarks/ruler_tokens.py`). The judge sees short labels (t1, t2...) instead of trajectory ids:
they are what it must answer with, and ids are long and mean nothing to it. Texts too long for the
token budget are trimmed in the middle with a visible marker, tool results first, everything else
only if that is not enough; a group that still does not fit raises `PromptTooLong`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from art_proxy.records import Feedback, JsonObject, JudgeMode
from art_proxy.ruler.checklist import checklist_answer_format, checklist_text
from art_proxy.ruler.errors import PromptTooLong
from art_proxy.ruler.rubric import Rubric

TokenCounter = Callable[[str], int]
# What trimming may shorten: tool results only, or every text (messages, tool-call arguments).
TrimScope = Literal["tools", "all"]

TRIM_MARKER = "[... {count} characters trimmed ...]"
# Below this a trimmed text keeps too little of either end to judge by.
MIN_KEPT_CHARS = 200

SYSTEM = """\
You are a careful judge of AI agent trajectories. Several attempts at the same task are shown, \
each one a trajectory. Compare them with each other and score each one by the rubric. Only the \
differences within this group matter, so be consistent: a better trajectory gets a higher score."""

NO_REST = "(nothing beyond the shared beginning)"


@dataclass(frozen=True)
class Member:
    """One trajectory to judge: its id, its conversation as it ended, the reward it reported."""

    trajectory_id: str
    messages: Sequence[JsonObject]
    reward: float | None = None  # programmatic, from the agent's finish; never shown to the judge
    # Users' feedback on it (production traffic), oldest first: shown to the judge as evidence
    # of how the answer landed, which a transcript alone cannot tell.
    feedback: Sequence[Feedback] = ()


@dataclass(frozen=True)
class JudgePrompt:
    messages: list[JsonObject]
    labels: dict[str, str]  # label the judge sees -> trajectory id, in the order shown
    tokens: int  # as counted by the counter the prompt was built with
    trimmed: bool


def approx_tokens(text: str) -> int:
    """About four characters a token for English, code and JSON under common BPE vocabularies."""
    return len(text) // 4 + 1


def build_prompt(
    members: Sequence[Member],
    rubric: Rubric,
    mode: JudgeMode,
    *,
    max_tokens: int = 0,
    count_tokens: TokenCounter = approx_tokens,
) -> JudgePrompt:
    """The judge's messages for `members`, trimmed to `max_tokens` (0 = no limit)."""
    labels = {f"t{index}": member.trajectory_id for index, member in enumerate(members, 1)}
    shared = shared_prefix_length([member.messages for member in members])

    def render(cap: int | None, scope: TrimScope) -> tuple[list[JsonObject], int]:
        messages = _messages(members, shared, list(labels), rubric, mode, cap, scope)
        return messages, count_tokens("\n".join(str(m["content"]) for m in messages))

    messages, tokens = render(None, "tools")
    if not max_tokens or tokens <= max_tokens:
        return JudgePrompt(messages, labels, tokens, trimmed=False)
    for scope in ("tools", "all"):
        longest = max((len(text) for text in _texts(members, scope)), default=0)
        messages, tokens = render(MIN_KEPT_CHARS, scope)
        if longest <= MIN_KEPT_CHARS or tokens > max_tokens:
            continue
        low, high = MIN_KEPT_CHARS, longest  # the largest cap that fits lies in [low, high)
        while high - low > 1:
            middle = (low + high) // 2
            if render(middle, scope)[1] <= max_tokens:
                low = middle
            else:
                high = middle
        messages, tokens = render(low, scope)
        return JudgePrompt(messages, labels, tokens, trimmed=True)
    raise PromptTooLong(
        f"the group needs {tokens} prompt tokens with every long text trimmed, "
        f"more than the budget of {max_tokens}"
    )


def shared_prefix_length(conversations: Sequence[Sequence[JsonObject]]) -> int:
    """How many leading messages all conversations have in common (0 for fewer than two)."""
    if len(conversations) < 2:
        return 0
    rendered = [[render_message(m, None, "tools") for m in conv] for conv in conversations]
    length = 0
    for column in zip(*rendered, strict=False):
        if any(text != column[0] for text in column[1:]):
            break
        length += 1
    return length


def render_message(message: JsonObject, cap: int | None, scope: TrimScope) -> str:
    """One message as the judge reads it: a role header, the text, then any tool calls."""
    role = str(message.get("role", "unknown"))
    is_tool = role in ("tool", "function")
    trim_text = cap is not None and (is_tool or scope == "all")
    if is_tool:
        name = message.get("name") or message.get("tool_call_id")
        lines = [f"[tool result {name}]" if name else "[tool result]"]
    else:
        lines = [f"[{role}]"]
    text = content_text(message.get("content"))
    if text:
        lines.append(trim_middle(text, cap) if trim_text else text)
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        if cap is not None and scope == "all":
            arguments = trim_middle(arguments, cap)
        lines.append(f"[tool call {function.get('name', 'unknown')}] {arguments}")
    return "\n".join(lines)


def render_feedback(feedback: Feedback) -> str:
    """One piece of a user's feedback as the judge reads it, after the trajectory it is about."""
    parts = []
    if feedback.thumbs is not None:
        parts.append(f"thumbs {feedback.thumbs}")
    if feedback.score is not None:
        parts.append(f"score {feedback.score:g}")
    if feedback.comment:
        parts.append(json.dumps(feedback.comment, ensure_ascii=False))
    return f"[user feedback] {', '.join(parts)}"


def content_text(content: object) -> str:
    """A message's text: a string, or the text parts of a list of parts ([image] for the rest)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return json.dumps(content)


def trim_middle(text: str, cap: int | None) -> str:
    """`text` if it has at most `cap` characters, else its two ends around a marker."""
    if cap is None or len(text) <= cap:
        return text
    head = cap // 2
    tail = cap - head
    marker = TRIM_MARKER.format(count=len(text) - cap)
    return f"{text[:head]}\n{marker}\n{text[len(text) - tail :]}"


def answer_format(labels: Sequence[str], mode: JudgeMode, rubric: Rubric = "") -> str:
    if not isinstance(rubric, str):
        return checklist_answer_format(labels, rubric)
    ids = ", ".join(labels)
    if mode == "logprob":
        lines = "\n".join(f"{label}: <digit>" for label in labels)
        return (
            "Score each trajectory with one digit from 0 (worst) to 9 (best). Reply with exactly "
            f"one line per trajectory, in this form and nothing else:\n{lines}"
        )
    return (
        "Reply with JSON only, in this form:\n"
        '{"scores": [{"id": "t1", "explanation": "<one or two sentences>", "score": <0 to 1>}]}\n'
        f"Give every id exactly once ({ids}), each with a score from 0 (worst) to 1 (best)."
    )


def _messages(
    members: Sequence[Member],
    shared: int,
    labels: Sequence[str],
    rubric: Rubric,
    mode: JudgeMode,
    cap: int | None,
    scope: TrimScope,
) -> list[JsonObject]:
    sections = []
    if shared:
        prefix = "\n\n".join(render_message(m, cap, scope) for m in members[0].messages[:shared])
        sections.append(
            "All trajectories begin with the same conversation, shown once:\n"
            f"<shared_beginning>\n{prefix}\n</shared_beginning>\n\n"
            "Each trajectory then continues as follows."
        )
    for label, member in zip(labels, members, strict=True):
        rest = "\n\n".join(render_message(m, cap, scope) for m in member.messages[shared:])
        said = "".join(f"\n{render_feedback(feedback)}" for feedback in member.feedback)
        sections.append(f'<trajectory id="{label}">\n{rest or NO_REST}{said}\n</trajectory>')
    rubric_text = rubric if isinstance(rubric, str) else checklist_text(rubric)
    sections.append(f"<rubric>\n{rubric_text}\n</rubric>")
    sections.append(answer_format(labels, mode, rubric))
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


def _texts(members: Sequence[Member], scope: TrimScope) -> list[str]:
    """The texts trimming at `scope` may shorten."""
    texts = []
    for member in members:
        for message in member.messages:
            is_tool = message.get("role") in ("tool", "function")
            if is_tool or scope == "all":
                texts.append(content_text(message.get("content")))
            if scope == "all":
                for call in message.get("tool_calls") or []:
                    arguments = (call.get("function") or {}).get("arguments", "")
                    texts.append(arguments if isinstance(arguments, str) else json.dumps(arguments))
    return texts
