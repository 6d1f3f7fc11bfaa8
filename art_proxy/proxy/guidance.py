"""Guided calls: guidance added to a call's prompt upstream, left out of what is trained.

A guided retry (rollout.py: a group whose rollouts all failed, run again with a hint) sends
`X-Art-Guidance: <the text, percent-encoded UTF-8>`. The proxy adds the text to the prompt it
sends upstream, after the content of the first system message (of the first user message when
there is none), separated by one space: a space keeps the text's tokens apart from the message's
under the pre-tokenizers of BPE vocabularies, where a newline would merge with the punctuation
before it. The record keeps the agent's own body, the prompt ids the model saw, and where in them
the guidance's tokens sit (`records.Guidance`), found by comparing them with the ids of the prompt
without it (the upstream's `/tokenize`, which renders a chat prompt as a chat call does). The
trainer leaves those tokens out and scores the sampled ones as if the guidance had never been
there; the recorded logprobs, sampled with it, enter only through the importance weight, which is
the correction Guide (the method behind guided retries) makes so the policy learns to succeed
without the guidance.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from art_proxy.errors import BadRequest
from art_proxy.records import Guidance, JsonObject

GUIDANCE_HEADER = "X-Art-Guidance"
MAX_GUIDANCE_CHARS = 4000
# The trainable-call reason of a guided call whose guidance could not be told from its prompt.
NOT_LOCATED = "guidance not located in the prompt's tokens"


def guidance_of(headers: Mapping[str, str]) -> str | None:
    """The guidance the call asks for (None: none); `BadRequest` for an empty, over-long or
    undecodable one."""
    value = headers.get(GUIDANCE_HEADER)
    if value is None:
        return None
    try:
        text = unquote(value, errors="strict").strip()
    except UnicodeDecodeError:
        text = ""
    if not text or len(text) > MAX_GUIDANCE_CHARS:
        raise BadRequest(
            f"{GUIDANCE_HEADER} must be 1 to {MAX_GUIDANCE_CHARS} characters of percent-encoded "
            "UTF-8"
        )
    return text


def guided_messages(messages: list[JsonObject], text: str) -> list[JsonObject]:
    """`messages` with `text` added to the first system message, else the first user message
    (a copy; `messages` is the agent's and is recorded as it was)."""
    roles = [message.get("role") for message in messages]
    index = next(
        (roles.index(role) for role in ("system", "developer", "user") if role in roles), None
    )
    if index is None:
        return [{"role": "system", "content": text}, *messages]
    message = messages[index]
    content = message.get("content")
    if isinstance(content, list):
        added: object = [*content, {"type": "text", "text": f" {text}"}]
    else:
        added = f"{content or ''} {text}"
    return [*messages[:index], {**message, "content": added}, *messages[index + 1 :]]


def located(text: str, unguided: list[int], guided: list[int]) -> Guidance | None:
    """Where `text`'s tokens sit in the `guided` prompt ids: the tokens between the longest
    prefix and suffix it shares with the `unguided` ones, which must make up all of those
    (None when they do not: a tokenizer that merged the text with its neighbours)."""
    limit = min(len(unguided), len(guided))
    prefix = 0
    while prefix < limit and unguided[prefix] == guided[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and unguided[-1 - suffix] == guided[-1 - suffix]:
        suffix += 1
    end = len(guided) - suffix
    if prefix + suffix != len(unguided) or end <= prefix:
        return None
    return Guidance(text=text, start=prefix, end=end)
