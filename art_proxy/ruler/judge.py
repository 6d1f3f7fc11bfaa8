"""The judge client: one chat completion through litellm, so any provider can judge.

`openai/MODEL` with a base URL reaches vLLM, art-proxy's local-llm or art-proxy itself;
`anthropic/...` and the rest go to their providers. It implements `client.JudgeClient`, the one
seam the scorer calls through; tests point it at a scripted judge server on loopback. Foreign
errors become `JudgeUnavailable` (a retry may help: unreachable, timeout, 408/409/429/5xx) or
`JudgeRejected` (it cannot), here and nowhere else. A judge that refuses structured output gets the
same request once more without it, and never again.
"""

from __future__ import annotations

import os
import re
import sys
from types import ModuleType
from typing import Any

import aiohttp
import openai  # litellm's errors derive from the SDK's

from art_proxy.errors import ConfigError
from art_proxy.records import JsonObject
from art_proxy.ruler.client import JudgeReply, JudgeRequest
from art_proxy.ruler.errors import JudgeRejected, JudgeUnavailable
from art_proxy.ruler.logprob import TOP_LOGPROBS, TokenChoice
from art_proxy.ruler.prompt import TokenCounter, approx_tokens

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_CLASS_PREFIX = re.compile(r"^(?:litellm\.)?\w+(?:Error|Exception): ")
# A digit answer is a handful of tokens per trajectory ("t12: 7\n" is about 5).
_LOGPROB_TOKENS_PER_LABEL = 8
_CHECK_TIMEOUT_S = 10.0
# After a prefilled `t1:`, the digit, or a space and then the digit.
_PREFILLED_TOKENS = 2
# Where a reasoning model's thinking shows inline (Qwen3, DeepSeek-R1 without a reasoning parser).
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def litellm_module() -> ModuleType:
    """litellm, imported on the first call that needs it (its import is most of a command's start,
    3 s of CPU here, which a command refusing its arguments in one line should not pay) and told
    to stay off the network: every import of litellm in art-proxy goes through here."""
    # Imported without it, litellm would fetch its price list from the network on every start.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback" banner on every failed call
    return litellm


class LitellmJudge:
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        timeout: float = 300.0,
    ) -> None:
        self.model = model
        self._base_url = base_url
        # A self-hosted OpenAI-compatible judge usually wants no key, but the SDK insists on one.
        self._api_key = api_key or (
            "unused" if base_url and not os.environ.get("OPENAI_API_KEY") else None
        )
        self._temperature = temperature
        self._timeout = timeout
        self._structured = True
        self._session: aiohttp.ClientSession | None = None
        self.context_tokens: int | None = None

    async def check(self) -> None:
        """Before any group is judged: ConfigError for a model litellm cannot route (no
        provider prefix) or a base URL nothing answers at, which would otherwise fail every
        group as `judge_failed` one by one."""
        try:
            litellm_module().get_llm_provider(self.model, api_base=self._base_url)
        except Exception as exc:  # litellm raises its BadRequestError, or a plain ValueError
            raise ConfigError(
                f"judge {self.model!r}: litellm cannot tell its provider: name it with a "
                f"prefix, e.g. openai/{self.model} for an OpenAI-compatible server "
                "(--judge-base-url), anthropic/..., hosted_vllm/..."
            ) from exc
        if self._base_url is None:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.get(
                self._base_url + "/models", timeout=aiohttp.ClientTimeout(total=_CHECK_TIMEOUT_S)
            ) as response:
                # Any answer: a server is there (a hosted one may want a key for /models).
                listed = await response.json(content_type=None) if response.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConfigError(
                f"judge base URL {self._base_url} does not answer ({type(exc).__name__}: {exc}): "
                "is the judge's server running there? (--judge-base-url, ending in /v1)"
            ) from exc
        except ValueError:  # not JSON: a server, but not one that says its context
            listed = {}
        self.context_tokens = _context_of(listed, self.model)

    async def complete(self, request: JudgeRequest) -> JudgeReply:
        structured = request.answer_schema is not None and self._structured
        try:
            return await self._complete(request, structured=structured)
        except JudgeRejected as exc:
            if not (structured and exc.status in (400, 422) and _about_format(str(exc))):
                raise
            self._structured = False
            return await self._complete(request, structured=False)

    async def prompt_tokens(self, messages: list[JsonObject]) -> int | None:
        if self._base_url is None or self.context_tokens is None:
            return None  # a hosted judge: no /tokenize, and --judge-max-prompt-tokens bounds it
        if self._session is None:
            self._session = aiohttp.ClientSession()
        root = self._base_url.removesuffix("/v1")
        body = {"model": _served_name(self.model), "messages": messages}
        try:
            async with self._session.post(
                root + "/tokenize", json=body, timeout=aiohttp.ClientTimeout(total=_CHECK_TIMEOUT_S)
            ) as response:
                if response.status != 200:
                    return None
                counted = (await response.json(content_type=None)).get("count")
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
            return None
        return counted if isinstance(counted, int) else None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        # Clients litellm cached for providers that ignore the shared session. Closing leaves
        # them in litellm's cache, where the next judge of this process (a trainer run after a
        # refused one, `eval`'s next arm) would get one and fail every call: empty it too.
        if "litellm" not in sys.modules:
            return  # no judge of this process has called through litellm: it holds no client
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        await close_litellm_async_clients()  # type: ignore[no-untyped-call]  # unannotated upstream
        litellm_module().in_memory_llm_clients_cache.flush_cache()

    async def _complete(self, request: JudgeRequest, *, structured: bool) -> JudgeReply:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        options: dict[str, Any] = {}
        if structured:
            options["response_format"] = request.answer_schema
        if request.mode == "logprob":
            options.update(
                logprobs=True,
                top_logprobs=TOP_LOGPROBS,
                max_tokens=_LOGPROB_TOKENS_PER_LABEL * request.labels + 8,
            )
        elif request.max_tokens is not None:
            options["max_tokens"] = request.max_tokens
        if request.continue_final:
            options.update(
                max_tokens=_PREFILLED_TOKENS,
                extra_body={"continue_final_message": True, "add_generation_prompt": False},
            )
        try:
            response = await litellm_module().acompletion(
                model=self.model,
                messages=request.messages,
                api_base=self._base_url,
                api_key=self._api_key,
                temperature=self._temperature,
                timeout=self._timeout,
                max_retries=0,  # the scorer retries, with backoff and a record of each try
                drop_params=True,  # a provider without logprobs or seeds still answers
                shared_session=self._session,
                **options,
            )
        except openai.APIStatusError as exc:
            raise _translated(exc, exc.status_code) from exc
        except (openai.OpenAIError, aiohttp.ClientError, TimeoutError) as exc:
            raise _translated(exc, getattr(exc, "status_code", None)) from exc
        return _reply(response)


def _translated(exc: Exception, status: int | None) -> JudgeUnavailable | JudgeRejected:
    first_line = next(iter(str(exc).strip().splitlines()), "")
    # litellm repeats the class name: "litellm.RateLimitError: RateLimitError: OpenAIException - ..."
    while (shorter := _CLASS_PREFIX.sub("", first_line, count=1)) != first_line:
        first_line = shorter
    message = f"{type(exc).__name__}: {first_line}"
    if status is None or status in _RETRYABLE_STATUS or status >= 500:
        return JudgeUnavailable(message)
    return JudgeRejected(f"HTTP {status}: {message}", status=status)


def _about_format(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in ("response_format", "json_schema", "structured"))


def _reply(response: Any) -> JudgeReply:
    choice = response.choices[0]
    usage = getattr(response, "usage", None)
    tokens = None
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if content:
        tokens = [
            TokenChoice(
                token=entry.token,
                logprob=entry.logprob,
                top=[(top.token, top.logprob) for top in entry.top_logprobs or []],
            )
            for entry in content
        ]
    text = choice.message.content or ""
    cut = getattr(choice, "finish_reason", None) == "length"
    return JudgeReply(
        text=text,
        tokens=tokens,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=_cost(response),
        cut=cut,
        cut_while_thinking=cut and _still_thinking(choice.message, text),
    )


def _still_thinking(message: Any, text: str) -> bool:
    """A reasoning model's thinking with no answer after it: apart from the answer (vLLM's
    `reasoning`, `reasoning_content` as older builds and litellm name it), or inline in a
    `<think>` not yet closed (a server without a reasoning parser)."""
    apart = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
    if apart and not text.strip():
        return True
    opened = text.rfind(_THINK_OPEN)
    return opened >= 0 and _THINK_CLOSE not in text[opened:]


def _cost(response: Any) -> float:
    """litellm's price for the call; 0 for a model it has no price for (local ones)."""
    cost = (getattr(response, "_hidden_params", None) or {}).get("response_cost")
    if cost is None:
        try:
            cost = litellm_module().completion_cost(completion_response=response)
        except Exception:  # litellm raises a plain Exception for an unpriced model
            cost = 0.0
    return float(cost or 0.0)


def _context_of(listed: Any, model: str) -> int | None:
    """The `max_model_len` vLLM and local-llm give each model in `/v1/models`, for `model`
    (litellm's name: its provider prefix off), or the only one listed."""
    entries = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(entries, list):
        return None
    served = _served_name(model)
    found = [e for e in entries if isinstance(e, dict) and e.get("id") in (served, model)]
    entry = found[0] if found else entries[0] if len(entries) == 1 else None
    context = entry.get("max_model_len") if isinstance(entry, dict) else None
    return context if isinstance(context, int) and context > 0 else None


def _served_name(model: str) -> str:
    """The name the judge's server knows `model` by: litellm's, its provider prefix off."""
    return model.split("/", 1)[-1]


def litellm_token_counter(model: str) -> TokenCounter:
    """litellm's token count for `model`'s tokenizer (OpenAI's where it knows no better)."""

    def count(text: str) -> int:
        try:
            return int(litellm_module().token_counter(model=model, text=text))
        except Exception:  # an unknown tokenizer must not stop judging: estimate instead
            return approx_tokens(text)

    return count
