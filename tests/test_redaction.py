"""Scrubbing: every kind of secret is redacted wherever it sits, and prose is left alone.

One example of each key and token `redaction.py` knows, so that the literal pieces it looks for
before running its regex cannot fall out of step with the regex.
"""

from __future__ import annotations

import pytest

from art_proxy.privacy import redaction
from art_proxy.privacy.redaction import REDACTED, scrub

SECRET_KEYS = [
    "api_key",
    "API-KEY",
    "apikey",
    "x-api-key",
    "proxy_authorization",
    "Authorization",
    "openai_api_key",
    "access_token",
    "Refresh-Token",
    "idtoken",
    "auth_token",
    "bearer_token",
    "password",
    "PASSWD",
    "secret",
    "client_secret",
    "Cookie",
    "set-cookie",
]

TOKENS = [
    "Bearer abcdefgh12345678",
    "bearer abc.def_ghi~jk1=",
    "sk-proj-abcdefghij1234567890",
    "sk-ant-api03-abcdefgh12345678",
    "hf_" + "a1B2c3D4e5F6g7H8i9J0k",
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k",
    "gho_" + "a1B2c3D4e5F6g7H8i9J0k",
    "ghu_" + "a1B2c3D4e5F6g7H8i9J0k",
    "ghs_" + "a1B2c3D4e5F6g7H8i9J0k",
    "ghr_" + "a1B2c3D4e5F6g7H8i9J0k",
    "github_pat_" + "a1B2c3D4e5F6g7H8i9J0k",
    "xoxb-1234567890-abc",
    "xoxp-1234567890-abc",
    "AKIA" + "ABCDEFGHIJ123456",
    "AIza" + "A" * 30 + "12345",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_a_secret_key_is_redacted_at_any_depth(key: str) -> None:
    body = {"model": "m", "extra": [{"headers": {key: "plain-looking-value", "X-Trace": "t"}}]}
    assert scrub(body) == {"model": "m", "extra": [{"headers": {key: REDACTED, "X-Trace": "t"}}]}


@pytest.mark.parametrize("token", TOKENS)
def test_a_token_is_redacted_inside_any_text(token: str) -> None:
    body = {"messages": [{"role": "user", "content": f"use {token} for it"}], "n": 1}
    assert scrub(body) == {
        "messages": [{"role": "user", "content": f"use {REDACTED} for it"}],
        "n": 1,
    }


def test_a_value_without_secrets_comes_back_itself() -> None:
    body = {
        "messages": [{"role": "user", "content": "bearer instruments for the task-list, sk- only"}],
        "max_tokens": 16,
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "monkey": "the key is under the mat",
        "token_ids": [1, 2, 3],
    }
    assert scrub(body) is body


def test_a_conversation_seen_clean_is_still_searched_where_it_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parts found clean are remembered (an agent sends its conversation again with every call),
    so only what is new is searched; a secret in the new part is still found, and the memory is
    bounded."""
    monkeypatch.setattr(redaction, "_CLEAN_PARTS_MAX", 8)
    conversation = [{"role": "user", "content": f"step {n}"} for n in range(6)]
    body = {"model": "m", "messages": conversation, "tools": [{"name": "search"}]}
    assert scrub(body) is body
    grown = {**body, "messages": [*conversation, {"role": "tool", "content": f"got {TOKENS[2]}"}]}
    assert scrub(grown)["messages"][-1] == {"role": "tool", "content": f"got {REDACTED}"}
    assert scrub(grown)["messages"][:-1] == conversation
    assert len(redaction._clean_parts) <= 8
