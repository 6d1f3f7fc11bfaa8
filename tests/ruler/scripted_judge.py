"""A scripted judge on loopback: speaks OpenAI's chat protocol, answers from a script, keeps the prompts.

    async with running_scripted_judge(answer_by_content(score_of)) as judge:
        ...  # LitellmJudge("openai/judge", base_url=judge.base_url); then inspect judge.requests

A script entry is a `Reply` or a function from the request body to one; entries are used in turn
and the last one repeats.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from art_proxy.testing.loopback import serving

Body = dict[str, Any]
_TRAJECTORY = re.compile(r'<trajectory id="(t\d+)">\n(.*?)\n</trajectory>', re.DOTALL)


@dataclass(frozen=True)
class Reply:
    content: str = ""
    status: int = 200  # anything else: an OpenAI-shaped error with this status
    logprobs: list[dict[str, Any]] | None = None  # choices[0].logprobs.content
    finish_reason: str = "stop"  # "length": the answer stopped at max_tokens
    # A reasoning model's thinking, apart from its answer (vLLM's `message.reasoning`; older
    # builds' `reasoning_content` with `reasoning_field`).
    reasoning: str | None = None
    reasoning_field: str = "reasoning"


Script = Reply | Callable[[Body], Reply]


@dataclass
class ScriptedJudge:
    base_url: str
    requests: list[Body] = field(default_factory=list)

    def prompt(self, index: int = -1) -> str:
        """The user message (the group, the rubric) of request `index`."""
        messages = self.requests[index]["messages"]
        return str(next(m["content"] for m in messages if m["role"] == "user"))


def tokens_in(messages: Sequence[Body]) -> int:
    """A context-bound scripted judge's token count: a token every 3 characters, more than
    the common tokenizers' 4 (what a judge with another tokenizer than litellm's counts)."""
    return sum(len(str(m.get("content", ""))) for m in messages) // 3 + 4 * len(messages)


@asynccontextmanager
async def running_scripted_judge(
    *script: Script, context_tokens: int | None = None
) -> AsyncIterator[ScriptedJudge]:
    """`context_tokens`: the judge says its context in `/v1/models` (`max_model_len`), counts
    prompts at `/tokenize` (`tokens_in`) and refuses a prompt longer than it, as vLLM does."""
    entries = list(script) or [Reply("{}")]
    app = web.Application()
    judge = ScriptedJudge(base_url="")

    async def models(_request: web.Request) -> web.Response:
        entry = {"id": "scripted", "object": "model", "max_model_len": context_tokens}
        return web.json_response({"object": "list", "data": [entry]})

    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"count": tokens_in((await request.json())["messages"])})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        judge.requests.append(body)
        if context_tokens is not None and (used := tokens_in(body["messages"])) > context_tokens:
            message = (
                f"This model's maximum context length is {context_tokens} tokens. However, "
                f"your prompt contains {used} input tokens."
            )
            error = {"message": message, "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        entry = entries[min(len(judge.requests), len(entries)) - 1]
        reply = entry(body) if callable(entry) else entry
        if reply.status != 200:
            error = {"message": reply.content or "scripted error", "type": "Error"}
            return web.json_response(
                {"error": {**error, "code": reply.status}}, status=reply.status
            )
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body["messages"])
        return web.json_response(
            {
                "id": f"chatcmpl-{len(judge.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": reply.content,
                            **({reply.reasoning_field: reply.reasoning} if reply.reasoning else {}),
                        },
                        "finish_reason": reply.finish_reason,
                        "logprobs": None if reply.logprobs is None else {"content": reply.logprobs},
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_chars // 4,
                    "completion_tokens": len(reply.content) // 4 + 1,
                    "total_tokens": prompt_chars // 4 + len(reply.content) // 4 + 1,
                },
            }
        )

    app.router.add_post("/v1/chat/completions", chat)
    if context_tokens is not None:
        app.router.add_get("/v1/models", models)
        app.router.add_post("/tokenize", tokenize)
    async with serving(app) as root_url:
        judge.base_url = f"{root_url}/v1"
        yield judge


def trajectories_in(body: Body) -> dict[str, str]:
    """Label -> the rendered rest of that trajectory, from a judge request."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return dict(_TRAJECTORY.findall(str(user)))


def json_answer(scores: Sequence[tuple[str, float]]) -> Reply:
    """A well-formed answer listing `(label, score)` in the order given."""
    items = [{"id": label, "explanation": f"{label} judged", "score": s} for label, s in scores]
    return Reply(json.dumps({"scores": items}))


def checklist_answer(marks: Mapping[str, Mapping[str, object]]) -> Reply:
    """A checklist answer: label -> criterion id -> mark, each explained as `<label> <criterion>`."""
    items = [
        {
            "id": label,
            "criteria": [
                {"id": criterion, "explanation": f"{label} {criterion}", "mark": mark}
                for criterion, mark in by_criterion.items()
            ],
        }
        for label, by_criterion in marks.items()
    ]
    return Reply(json.dumps({"scores": items}))


def answer_by_content(score_of: Callable[[str], float], *, reverse: bool = True) -> Script:
    """Scores each trajectory by its text; answers in reverse label order to test the mapping."""

    def answer(body: Body) -> Reply:
        shown = trajectories_in(body)
        scores = [(label, score_of(text)) for label, text in shown.items()]
        return json_answer(scores[::-1] if reverse else scores)

    return answer


def logprob_tokens(distributions: Mapping[str, Mapping[int, float]]) -> list[dict[str, Any]]:
    """`t1: 7` lines whose digit token carries `distributions[label]` as its top_logprobs."""

    def token(text: str, logprob: float = 0.0, top: Sequence[tuple[str, float]] = ()) -> Body:
        listed = top or [(text, logprob)]
        return {
            "token": text,
            "logprob": logprob,
            "bytes": None,
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in listed],
        }

    tokens = []
    for label, distribution in distributions.items():
        best = max(distribution, key=lambda digit: distribution[digit])
        top = [(str(d), math.log(p)) for d, p in distribution.items() if p > 0]
        top.append(("hello", math.log(0.01)))  # a non-digit runner-up, to be ignored
        tokens += [token("t"), token(label[1:]), token(":"), token(" ")]
        tokens += [token(str(best), math.log(distribution[best]), top), token("\n")]
    return tokens
