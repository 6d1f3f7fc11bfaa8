"""A teacher model scoring the tokens the agent sampled: on-policy distillation's per-token signal.

For each trained choice of a recorded call, the teacher is asked for the logprob of each of the
choice's completion ids after the ids before it: vLLM's `prompt_logprobs` on `/v1/completions`,
the prompt sent as token ids (the call's prompt ids, then the completion ids; `max_tokens` 1, the
one token generated is thrown away), so no text is ever re-tokenized. The teacher must therefore
share the student's tokenizer: `check` compares the two servers' `/tokenize` of a probe and
refuses a teacher whose ids differ, before any step. Hosted APIs serve no `prompt_logprobs` and no
`/tokenize`: they can be judges or the source of demonstrations, never a teacher here.

With a `context` (context distillation), the teacher is shown what the student was not (a system
prompt, a hint, a worked example): the call's messages with the context added, rendered by the
teacher's server (`/tokenize`, as it renders a chat call), then the student's completion ids.

The trainer turns these into the per-token reward log p_teacher(y_t) - log pi_sampler(y_t), minus
the reverse KL's single-sample estimate on the student's own tokens; the sampler's logprobs are the
ones the proxy recorded (what the tokens were drawn from), so the estimate needs no other model.

Teacher calls are I/O like the judge's: at most `concurrency` at once, retried on a network error
or a 5xx, cached by (call, choice) for the teacher's life, and counted (`TeacherCounters`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp

from art_proxy.errors import ConfigError
from art_proxy.proxy.guidance import guided_messages
from art_proxy.records import CallRecord, TrainableGroup
from art_proxy.scenarios import Scenario

# A short text whose ids tell two tokenizers apart: words, digits, punctuation and a non-ASCII
# letter, where vocabularies differ first.
TOKENIZER_PROBE = "Teacher probe: Zürich, 1,234.5 tokens; don't re-tokenize!"
_TIMEOUT = aiohttp.ClientTimeout(total=300)
_RETRIES = 3
_BACKOFF_S = 0.5
_HOSTED = (
    "a hosted API? They serve neither `prompt_logprobs` nor `/tokenize`: use one as a judge or "
    "as the source of demonstrations (--sft), and a vLLM or local-llm server as the teacher"
)


class TeacherError(ConfigError):
    """A teacher that cannot score: unreachable, without `prompt_logprobs`, another tokenizer."""


@dataclass
class TeacherCounters:
    """What the teacher was asked, summed since it started (a step reads the difference)."""

    calls: int = 0  # calls scored (cache hits not counted)
    tokens: int = 0  # completion tokens scored
    prompt_tokens: int = 0  # ids sent, context included
    failed: int = 0  # calls it could not score (e.g. past its context window)
    seconds: float = 0.0  # summed latency of its answers

    def minus(self, earlier: TeacherCounters) -> TeacherCounters:
        return TeacherCounters(
            self.calls - earlier.calls,
            self.tokens - earlier.tokens,
            self.prompt_tokens - earlier.prompt_tokens,
            self.failed - earlier.failed,
            self.seconds - earlier.seconds,
        )


@dataclass
class Teacher:
    """A vLLM-compatible server and model that scores sampled tokens (`logprobs`)."""

    base_url: str  # ending in /v1
    model: str
    api_key: str | None = None
    # Shown to the teacher and not to the student (context distillation): a system prompt, a
    # hint, a worked example. None: the teacher sees the student's own prompt.
    context: str | None = None
    concurrency: int = 8
    counters: TeacherCounters = field(default_factory=TeacherCounters)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)
    _slots: asyncio.Semaphore = field(init=False, repr=False)
    _cache: dict[tuple[str, int], tuple[float, ...] | None] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        self._slots = asyncio.Semaphore(self.concurrency)

    async def __aenter__(self) -> Teacher:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._session = aiohttp.ClientSession(timeout=_TIMEOUT, headers=headers)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def root(self) -> str:
        """The server's root, where vLLM serves `/tokenize`."""
        return self.base_url.removesuffix("/v1")

    async def check(self, student_base_url: str, student_model: str) -> None:
        # `student_model` names the student in what is said; its server tokenizes as its base.
        """Refuse, in one line, a teacher that cannot score this student's tokens: one that does
        not answer or serve the model, tokenizes the probe otherwise than the student's server,
        answers no `prompt_logprobs`, or whose context window the context alone fills."""
        cards = await self._models()
        if self.model not in cards:
            raise TeacherError(
                f"teacher {self.base_url} serves no model {self.model!r} "
                f"(it serves: {', '.join(cards) or 'none'})"
            )
        teacher_ids = await self._tokenized(self.root, self.model, "teacher")
        # The student's server's own base model (what the alias and adapters sit on).
        student_ids = await self._tokenized(
            student_base_url.rstrip("/").removesuffix("/v1"), None, "student"
        )
        if teacher_ids != student_ids:
            raise TeacherError(
                f"teacher {self.model} tokenizes text otherwise than the student {student_model} "
                f"({len(teacher_ids)} ids against {len(student_ids)} for the same probe): the "
                "teacher scores the student's token ids as they are, so it must share its tokenizer"
            )
        try:
            await self._prompt_logprobs(teacher_ids[:1], teacher_ids[1:])
        except _Refused as exc:
            raise TeacherError(
                f"teacher {self.base_url} refused prompt_logprobs ({exc}): {_HOSTED}"
            ) from exc
        window = cards[self.model].get("max_model_len")
        if self.context is not None and isinstance(window, int) and window > 0:
            # The context comes before every call the teacher scores: alone, it must leave room.
            try:
                rendered = await self._post(
                    f"{self.root}/tokenize",
                    {"model": self.model, "messages": guided_messages([], self.context)},
                )
            except _Refused as exc:
                raise TeacherError(
                    f"teacher {self.root}/tokenize refused --teacher-context as a system "
                    f"message ({exc})"
                ) from exc
            length = len(rendered.get("tokens", [])) if isinstance(rendered, dict) else 0
            if length >= window:
                raise TeacherError(
                    f"--teacher-context is {length} tokens, past teacher {self.model}'s context "
                    f"window of {window}: shorten it, or serve the teacher with a longer one"
                )
        self.counters = TeacherCounters()  # the probe is not the run's

    async def call_logprobs(
        self,
        call: CallRecord,
        choice: int,
        prompt_ids: Sequence[int],
        scenario_context: str | None = None,
    ) -> tuple[float, ...] | None:
        """The teacher's logprobs of `call`'s choice `choice` after `prompt_ids` (the prompt
        the student is trained on), or with a context (`context`, then the call's scenario's
        `scenario_context`), after the call's messages as the teacher's server renders them with
        the context added as a guided retry's guidance is (`guided_messages`), so that a
        teacher's view is what `eval --arm-context` measures."""
        assert call.completion_token_ids is not None
        completion = call.completion_token_ids[choice]
        context = "\n\n".join(text for text in (self.context, scenario_context) if text) or None
        if context is not None:
            messages = call.request.get("messages")
            if call.kind != "chat" or not isinstance(messages, list):
                self.counters.failed += 1
                return None
            body: dict[str, Any] = {
                "model": self.model,
                "messages": guided_messages(messages, context),
            }
            if call.request.get("tools"):
                body["tools"] = call.request["tools"]
            try:
                answer = await self._post(f"{self.root}/tokenize", body)
                prompt_ids = [int(token) for token in answer["tokens"]]
            except (_Refused, KeyError, TypeError, ValueError):
                self.counters.failed += 1
                return None
        return await self.logprobs((call.id, choice), prompt_ids, completion)

    async def logprobs(
        self, key: tuple[str, int], prompt_ids: Sequence[int], completion_ids: Sequence[int]
    ) -> tuple[float, ...] | None:
        """The teacher's logprob of each of `completion_ids` after `prompt_ids` and the ids
        before it; None where it cannot score them (the call past its context window: counted,
        and the step goes on without this choice's teacher term). Cached by `key`, the call's
        id and choice."""
        if key in self._cache:
            return self._cache[key]
        try:
            scored: tuple[float, ...] | None = await self._prompt_logprobs(
                prompt_ids, completion_ids
            )
        except _Refused:
            self.counters.failed += 1
            scored = None
        self._cache[key] = scored
        return scored

    async def _prompt_logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int]
    ) -> tuple[float, ...]:
        ids = [*prompt_ids, *completion_ids]
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        async with self._slots:
            began = time.perf_counter()
            answer = await self._post(f"{self.base_url}/completions", body)
            self.counters.seconds += time.perf_counter() - began
        try:
            entries = answer["choices"][0]["prompt_logprobs"]
            scored = tuple(
                float(entries[position][str(ids[position])]["logprob"])
                for position in range(len(prompt_ids), len(ids))
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise TeacherError(
                f"teacher {self.base_url} answered no prompt_logprobs for its prompt: {_HOSTED}"
            ) from exc
        self.counters.calls += 1
        self.counters.tokens += len(completion_ids)
        self.counters.prompt_tokens += len(ids)
        return scored

    async def _models(self) -> dict[str, dict[str, Any]]:
        """The served models' cards by id."""
        answer = await self._get(f"{self.base_url}/models")
        try:
            return {str(card["id"]): dict(card) for card in answer["data"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise TeacherError(f"teacher {self.base_url}/models is not a model list") from exc

    async def _tokenized(self, root: str, model: str | None, who: str) -> list[int]:
        body = {"prompt": TOKENIZER_PROBE} | ({"model": model} if model else {})
        try:
            answer = await self._post(f"{root}/tokenize", body)
        except _Refused as exc:
            raise TeacherError(
                f"the {who}'s server {root}/tokenize refused the tokenizer probe ({exc}): {_HOSTED}"
            ) from exc
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise TeacherError(f"the {who}'s server {root}/tokenize answered no tokens")
        return [int(token) for token in tokens]

    async def _get(self, url: str) -> Any:
        return await self._request("GET", url, None)

    async def _post(self, url: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", url, body)

    async def _request(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        """The JSON answer; a network error or a 5xx is retried, a 4xx raises `_Refused`, and
        a server that never answers raises `TeacherError`."""
        assert self._session is not None, "use `async with Teacher(...)`"
        failure = ""
        for attempt in range(_RETRIES):
            if attempt:
                await asyncio.sleep(_BACKOFF_S * 2 ** (attempt - 1))
            try:
                async with self._session.request(method, url, json=body) as response:
                    if response.status < 400:
                        return await response.json(content_type=None)
                    text = (await response.text())[:300]
                    if response.status < 500:
                        raise _Refused(f"{response.status}: {text}")
                    failure = f"{response.status}: {text}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
        raise TeacherError(f"teacher {url} did not answer ({failure}) after {_RETRIES} tries")


def teacher_context(path: str | None, flag: str = "--teacher-context") -> str | None:
    """The text of a context file, `--teacher-context FILE` (or `flag`'s; None: none);
    `ConfigError` in one line."""
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not text:
        raise ConfigError(f"{flag} {path} is empty")
    return text


def scenario_contexts(
    scenarios: Sequence[Scenario], source: Literal["hint", "reference"] | None
) -> dict[str, str]:
    """What the teacher is shown of each scenario (`--teacher-context-from`): its hint, or its
    reference answer (text as it is, anything else as JSON); scenarios without one are left out."""
    if source is None:
        return {}
    shown: dict[str, str] = {}
    for scenario in scenarios:
        value = scenario.hint if source == "hint" else scenario.reference
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        shown[scenario.id] = text if source == "hint" else f"A correct answer: {text}"
    return shown


def trajectory_contexts(
    groups: Sequence[TrainableGroup], by_scenario: Mapping[str, str]
) -> dict[str, str]:
    """What the teacher is shown of each member of `groups`: its scenario's (`by_scenario`,
    from `scenario_contexts`), where it has one."""
    return {
        trajectory: by_scenario[group.scenario_id]
        for group in groups
        if group.scenario_id in by_scenario
        for trajectory in group.members
    }


class _Refused(Exception):
    """The server answered 4xx: the request, not the server, is at fault."""
