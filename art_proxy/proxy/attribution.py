"""Which scenario and trajectory a call belongs to, strongest signal first.

1. URL prefix `/scenario/{scenario}[/group/{group}][/trajectory/{trajectory}][/split/{split}]/v1`
   (then `/chat/completions` and the rest);
2. headers `X-Art-Scenario`, `X-Art-Group`, `X-Art-Trajectory`, `X-Art-Split`;
3. automatic, for unmodified agents: a call whose messages start with an open trajectory's last
   call (its messages plus the reply) continues that trajectory, and the scenario is a hash of the
   conversation before the first assistant turn that follows a user message.

An explicit group is for rollout runners: each batch of one scenario is its own group whatever the
group window says (see tracker.py).

Automatic matching compares *canonical* messages, since clients echo a reply back in their own way:
the OpenAI SDK sends `content: null` and extra null keys, LangChain re-serialises tool-call arguments
with other whitespace. Canonical form keeps role, text, tool calls (arguments as normalised JSON) and
the tool-call id a tool result answers, and nothing else.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from art_proxy.errors import BadRequest
from art_proxy.privacy.subjects import NO_SUBJECT, Subject
from art_proxy.records import SPLITS, JsonObject, Split

_MAX_ID_LENGTH = 200
_MAX_GROUP_ID_LENGTH = 64  # the store's groups.id


@dataclass(frozen=True)
class Explicit:
    """What the agent said about attribution itself (URL prefix or headers)."""

    scenario_id: str | None
    trajectory_id: str | None
    split: Split
    source: Literal["url", "header", "none"]
    group_id: str | None = None
    subject: Subject = NO_SUBJECT  # whose conversation it is (privacy/subjects.py)


def explicit_attribution(
    url: Mapping[str, str], headers: Mapping[str, str], default_split: Split = "train"
) -> Explicit:
    """Merge the URL prefix (the route's `scenario`, `group`, `trajectory`, `split`) and `X-Art-*`
    headers; the URL wins where both speak. A call with neither split is `default_split`."""
    split = url.get("split") or headers.get("X-Art-Split") or default_split
    if split not in SPLITS:
        named = "the URL's split" if url.get("split") else "X-Art-Split"
        raise BadRequest(f"{named} must be one of {', '.join(SPLITS)}, not {split!r}")
    scenario = url.get("scenario") or headers.get("X-Art-Scenario") or None
    group = url.get("group") or headers.get("X-Art-Group") or None
    trajectory = url.get("trajectory") or headers.get("X-Art-Trajectory") or None
    for name, value, limit in (
        ("scenario", scenario, _MAX_ID_LENGTH),
        ("group", group, _MAX_GROUP_ID_LENGTH),
        ("trajectory", trajectory, _MAX_ID_LENGTH),
    ):
        if value is not None and (len(value) > limit or not value.isprintable()):
            raise BadRequest(f"{name} id must be printable and at most {limit} characters")
    source: Literal["url", "header", "none"]
    if any(url.get(part) for part in ("scenario", "group", "trajectory")):
        source = "url"
    elif scenario or group or trajectory:
        source = "header"
    else:
        source = "none"
    return Explicit(scenario, trajectory, split, source, group)


def canonical_message(message: JsonObject) -> JsonObject:
    canonical: JsonObject = {
        "role": message.get("role"),
        "content": _canonical_content(message.get("content")),
    }
    tool_calls = message.get("tool_calls")
    if tool_calls:
        canonical["tool_calls"] = [_canonical_tool_call(call) for call in tool_calls]
    if message.get("tool_call_id"):
        canonical["tool_call_id"] = message["tool_call_id"]
    return canonical


def _canonical_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content
    ):
        return "".join(str(part.get("text", "")) for part in content)
    return content


def _canonical_tool_call(call: Any) -> JsonObject:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        function = {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            arguments = orjson.loads(arguments)
    call_id = call.get("id") if isinstance(call, dict) else None
    return {"id": call_id, "name": function.get("name"), "arguments": arguments}


def _hasher(messages: list[JsonObject]) -> hashlib.blake2b:
    """A hash fed message by message, so every prefix's key costs one `copy()`, not a re-hash.

    Each canonical message is one orjson line (orjson escapes newlines, so lines cannot run
    together).
    """
    hasher = hashlib.blake2b(digest_size=16)
    for message in messages:
        _feed(hasher, message)
    return hasher


def _feed(hasher: hashlib.blake2b, message: JsonObject) -> None:
    hasher.update(orjson.dumps(canonical_message(message), option=orjson.OPT_SORT_KEYS))
    hasher.update(b"\n")


def conversation_key(messages: list[JsonObject]) -> str:
    """A stable hash of canonical messages (the keys of automatic attribution)."""
    return _hasher(messages).hexdigest()


def reply_keys(messages: list[JsonObject], replies: list[JsonObject]) -> list[str]:
    """`conversation_key(messages + [reply])` for each reply, hashing `messages` once."""
    return call_keys(messages, replies)[1]


def call_keys(messages: list[JsonObject], replies: list[JsonObject]) -> tuple[str, list[str]]:
    """`conversation_key(messages)` (the prompt key a re-rendered continuation is found by) and
    `reply_keys(messages, replies)`, hashing `messages` once."""
    prefix = _hasher(messages)
    keys = []
    for reply in replies:
        hasher = prefix.copy()
        _feed(hasher, reply)
        keys.append(hasher.hexdigest())
    return prefix.hexdigest(), keys


def opening_of(messages: list[JsonObject]) -> list[JsonObject]:
    """The conversation before the first assistant turn that answers a user: what defines a
    scenario automatically. An assistant greeting before the first user message belongs to the
    opening, or "Refund order 17" and "Reset my password" after one greeting would share a
    scenario and be ranked against each other."""
    asked = False
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and asked:
            return messages[:position]
        asked = asked or role == "user"
    return messages


AUTO_SCENARIO_PREFIX = "auto-"


def auto_scenario_id(messages: list[JsonObject]) -> str:
    return AUTO_SCENARIO_PREFIX + conversation_key(opening_of(messages))


@dataclass(frozen=True)
class Candidate:
    """An assistant message of a call's messages: where an earlier call of its conversation may
    have ended."""

    position: int  # of the assistant message
    key: str  # conversation_key(messages[: position + 1]): continues a call that replied this
    prompt_key: str  # conversation_key(messages[:position]): continues a call that was asked this


def candidates(messages: list[JsonObject]) -> list[Candidate]:
    """Every assistant message of `messages`, the longest conversation first (one hash pass)."""
    return conversation_of(messages).candidates


@dataclass(frozen=True)
class Conversation:
    """The keys a call's messages give, from one pass of the hash over them: where an earlier
    call of the conversation may have ended (attribution), the key of its opening (an automatic
    scenario's), and the hash of them all, which the call's record extends with each reply (the
    keys the next call is recognised by). An agent sends its whole conversation with each call;
    hashing it once instead of three times took 106 instead of 185 us for 21 messages of 13 KB."""

    candidates: list[Candidate]  # the longest conversation first
    opening_key: str  # conversation_key(opening_of(messages))
    whole: hashlib.blake2b  # fed every message; copied, never fed again

    @property
    def prompt_key(self) -> str:
        """`conversation_key(messages)`."""
        return self.whole.hexdigest()

    @property
    def scenario_id(self) -> str:
        """`auto_scenario_id(messages)`: the scenario of a call that names none."""
        return AUTO_SCENARIO_PREFIX + self.opening_key

    def reply_keys(self, replies: list[JsonObject]) -> list[str]:
        """`conversation_key(messages + [reply])` for each reply."""
        keys = []
        for reply in replies:
            hasher = self.whole.copy()
            _feed(hasher, reply)
            keys.append(hasher.hexdigest())
        return keys


def conversation_of(messages: list[JsonObject]) -> Conversation:
    hasher = hashlib.blake2b(digest_size=16)
    found = []
    opening_key = None
    asked = False
    for position, message in enumerate(messages):
        assistant = message.get("role") == "assistant"
        prompt_key = hasher.copy().hexdigest() if assistant else ""
        if assistant and asked and opening_key is None:  # as `opening_of` cuts it
            opening_key = prompt_key
        _feed(hasher, message)
        if assistant:
            found.append(Candidate(position, hasher.copy().hexdigest(), prompt_key))
        asked = asked or message.get("role") == "user"
    found.reverse()
    return Conversation(found, opening_key or hasher.hexdigest(), hasher)


def continuation_candidates(messages: list[JsonObject]) -> list[str]:
    """Keys of the earlier calls this call may continue, longest conversation first.

    A call continues an earlier one when its messages start with that call's messages plus its
    reply, so every prefix ending in an assistant message is a candidate.
    """
    return [candidate.key for candidate in candidates(messages)]


def verbatim(reply: JsonObject, echoed: JsonObject) -> bool:
    """Whether an echoed assistant message carries the reply's text and tool calls as the model
    wrote them (canonical equality forgives whitespace in arguments; the tokens do not)."""

    def written(message: JsonObject) -> tuple[Any, list[tuple[Any, Any, Any]]]:
        calls = [
            (
                call.get("id"),
                (call.get("function") or {}).get("name"),
                (call.get("function") or {}).get("arguments"),
            )
            for call in message.get("tool_calls") or []
            if isinstance(call, dict)
        ]
        return _canonical_content(message.get("content")), calls

    return written(reply) == written(echoed)


def as_sampled(reply: JsonObject, echoed: JsonObject) -> JsonObject | None:
    """The echoed message as the model wrote it, when it says what the reply said in another
    form (so the upstream renders the tokens the model sampled); None when it says something
    else. The forms: the canonical message the conversation keys hash (same text, same tool-call
    ids and names, arguments equal as JSON: pydantic-ai on openai 3 sends `{"city":"Paris"}` back
    for the model's `{"city": "Paris"}`), and the tool calls written back as text (smolagents:
    the reply's text, then `Calling tools:` and the calls as a Python list)."""
    replied = [call for call in reply.get("tool_calls") or [] if isinstance(call, dict)]
    if canonical_message(reply) == canonical_message(echoed):
        restored = {**echoed, "content": reply.get("content")}
        echoed_calls = [call for call in echoed.get("tool_calls") or [] if isinstance(call, dict)]
        if echoed_calls:
            restored["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **(call.get("function") or {}),
                        "arguments": (original.get("function") or {}).get("arguments"),
                    },
                }
                for call, original in zip(echoed_calls, replied, strict=False)
            ]
        return restored
    written = _calls_written_as_text(echoed)
    if written is None or not replied or echoed.get("role") != "assistant":
        return None
    text, calls = written
    reply_text = _canonical_content(reply.get("content"))
    if not isinstance(reply_text, str) or text != reply_text.strip():
        return None
    if calls != [_canonical_tool_call(call) for call in replied]:
        return None
    return {"role": "assistant", "content": reply.get("content"), "tool_calls": replied}


_CALLS_AS_TEXT = "Calling tools:\n"  # smolagents' memory writes a tool-call step so
_MAX_CALLS_TEXT = 1 << 20  # a literal longer than this is not parsed (ast's cost grows with it)


def _calls_written_as_text(echoed: JsonObject) -> tuple[str, list[JsonObject]] | None:
    """An assistant message that writes tool calls as text: (the text before them, each call's
    canonical form), or None when it is not one."""
    text = _canonical_content(echoed.get("content"))
    if echoed.get("tool_calls") or not isinstance(text, str):
        return None
    before, mark, literal = text.rpartition(_CALLS_AS_TEXT)
    if not mark or len(literal) > _MAX_CALLS_TEXT:
        return None
    try:
        calls = ast.literal_eval(literal.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
        return None
    return before.strip(), [_canonical_tool_call(call) for call in calls]


def resemblance(reply: JsonObject, echoed: JsonObject) -> int:
    """How many of what a reply said survive in an echoed message of any form (smolagents writes
    the tool calls back as a Python repr in text): its tool-call ids and its text. 0: nothing of
    it is there."""
    marks = [
        str(call.get("id"))
        for call in reply.get("tool_calls") or []
        if isinstance(call, dict) and call.get("id")
    ]
    content = _canonical_content(reply.get("content"))
    if isinstance(content, str) and content.strip():
        marks.append(content.strip())
    if not marks:
        return 0
    haystack = "\n".join(_strings(echoed))
    return sum(mark in haystack for mark in marks)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def reply_messages(response: JsonObject) -> list[JsonObject]:
    """The assistant message of every choice of a chat response, as a client would echo it."""
    return [
        choice["message"]
        for choice in response.get("choices") or []
        if isinstance(choice.get("message"), dict)
    ]
