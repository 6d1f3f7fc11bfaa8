"""Best-of-N at serve time: sample N answers, answer with the best, train on the ranking.

A chat call that opens a conversation and asks for it (`X-Art-Best-Of: N`), or that `--best-of-
fraction` draws (prod calls, N = `--best-of`), goes upstream once with `n: N` (vLLM shares the
prompt's prefix across the N samples). A chooser scores the N candidates: the user's check
(`--best-of-check module:function`, a score in [0, 1] for one candidate) or RULER
(`--best-of-judge MODEL`, the candidates ranked against each other). The best goes back to the
agent as an ordinary answer, streamed if it asked for a stream. All N are recorded, each as a
one-call trajectory of a group of their own, together with the judgment that chose (its judge
named `best-of:<chooser>`): the ranking that served the user is what the group trains on, and the
offline judge leaves such a group alone. The agent's own trajectory records the answer it got and
goes on from it, but that call is untrainable: the answer was chosen as the best of N samples, not
drawn from the policy, so training it as sampled would bias the gradient (and train its tokens a
second time, beside its candidate's); the trajectory's later calls train as any.

A chooser that fails or outlasts `--best-of-timeout` costs the user nothing but the wait: the first
candidate is answered and the group is recorded unjudged (the offline judge can still judge it).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, cast

from art_proxy.config import ProxySettings
from art_proxy.errors import BadRequest, ConfigError
from art_proxy.ids import new_id
from art_proxy.records import BEST_OF_JUDGE_PREFIX, JsonObject, Judgment, TrajectoryScore
from art_proxy.store.judgments import judgment_row
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .call import CallInProgress, Outcome
from .recording import Recorder
from .tracker import Assignment, TrajectoryTracker

if TYPE_CHECKING:
    from art_proxy.privacy.pii import PiiRedactor
    from art_proxy.ruler.judge import LitellmJudge
    from art_proxy.ruler.scorer import Ruler

log = logging.getLogger(__name__)

BEST_OF_HEADER = "X-Art-Best-Of"
# The untrainable reason of the agent's own best-of call.
BEST_OF_ANSWER = "chosen by best-of-N (trained in its candidate group, not as sampled)"
MAX_CANDIDATES = 16

# A check: (the call's messages, one candidate {message, finish_reason}) -> its score in [0, 1].
Check = Callable[[list[JsonObject], JsonObject], float | Awaitable[float]]


class ChooserError(Exception):
    """The chooser could not score the candidates: the first one is answered."""


class Chooser(Protocol):
    name: str  # the judgment's judge, after `best-of:`

    async def judge(
        self, group_id: str, messages: list[JsonObject], candidates: Sequence[Candidate]
    ) -> Judgment:
        """The candidates' judgment (scored, or the reason it failed); never stored here."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Candidate:
    """One of the N answers: its trajectory and its answer as a one-choice chat response."""

    assignment: Assignment
    response: JsonObject

    @property
    def choice(self) -> JsonObject:
        choice: JsonObject = self.response["choices"][0]
        return {"message": choice.get("message") or {}, "finish_reason": choice["finish_reason"]}


def asked_candidates(headers: Mapping[str, str]) -> int | None:
    """The N of `X-Art-Best-Of` (None: not asked; 1 asks for the call as it is);
    `BadRequest` for anything but 1 to `MAX_CANDIDATES`."""
    value = headers.get(BEST_OF_HEADER)
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_CANDIDATES:
        raise BadRequest(f"{BEST_OF_HEADER} must be a whole number from 1 to {MAX_CANDIDATES}")
    return n


class CheckChooser:
    """Scores each candidate with the user's own check, `module:function`."""

    def __init__(self, spec: str, check: Check) -> None:
        self.name = f"check:{spec}"
        self._check = check

    async def judge(
        self, group_id: str, messages: list[JsonObject], candidates: Sequence[Candidate]
    ) -> Judgment:
        scores = [await self._score(messages, candidate) for candidate in candidates]
        return Judgment(
            id=new_id(),
            group_id=group_id,
            judge_model=BEST_OF_JUDGE_PREFIX + self.name,
            mode="json",
            rubric_hash="",
            cache_key="",
            status="scored",
            trajectory_ids=[candidate.assignment.trajectory_id for candidate in candidates],
            scores=[
                TrajectoryScore(
                    trajectory_id=candidate.assignment.trajectory_id,
                    label=f"t{i}",
                    score=score,
                    explanation=f"{self.name} scored it {score:g}",
                    reward=score,
                )
                for i, (candidate, score) in enumerate(zip(candidates, scores, strict=True), 1)
            ],
            attempts=len(candidates),
            created_at=utcnow(),
        )

    async def _score(self, messages: list[JsonObject], candidate: Candidate) -> float:
        try:
            score = self._check(messages, candidate.choice)
            if inspect.isawaitable(score):
                score = await score
        except Exception as exc:  # the user's code: whatever it raises, the user gets an answer
            raise ChooserError(f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise ChooserError(f"{self.name} returned {score!r}, not a score in [0, 1]")
        if not (math.isfinite(score) and 0.0 <= score <= 1.0):
            raise ChooserError(f"{self.name} returned {score!r}, not a score in [0, 1]")
        return float(score)

    async def aclose(self) -> None:
        return None


class RulerChooser:
    """Ranks the candidates against each other with RULER: each shown as the call's messages
    and its answer."""

    def __init__(self, ruler: Ruler, judges: Sequence[LitellmJudge]) -> None:
        self.name = f"ruler:{ruler.judge_model}"
        self._ruler = ruler
        self._judges = list(judges)

    async def judge(
        self, group_id: str, messages: list[JsonObject], candidates: Sequence[Candidate]
    ) -> Judgment:
        from art_proxy.ruler.prompt import Member

        members = [
            Member(candidate.assignment.trajectory_id, [*messages, candidate.choice["message"]])
            for candidate in candidates
        ]
        judgment = await self._ruler.judgment(group_id, members)
        return judgment.model_copy(update={"judge_model": BEST_OF_JUDGE_PREFIX + self.name})

    async def aclose(self) -> None:
        for judge in self._judges:
            await judge.aclose()


class BestOf:
    def __init__(
        self,
        tracker: TrajectoryTracker,
        recorder: Recorder,
        chooser: Chooser | None,
        *,
        candidates: int,
        fraction: float,
        timeout_s: float,
    ) -> None:
        self._tracker = tracker
        self._recorder = recorder
        self._counters = recorder.counters
        self._chooser = chooser
        self._candidates = candidates
        self._fraction = fraction
        self._timeout_s = timeout_s

    def candidates(self, call: CallInProgress, asked: int | None) -> int:
        """How many candidates to sample for `call` (0: answer it as asked). `asked` is the
        header's N. A call best-of cannot answer (a later turn, one that asks for n > 1 or for
        temperature 0) is answered as asked: an agent sends its header on every call. Asked of a
        proxy without a chooser, `BadRequest`: the operator's mistake, said at once."""
        if asked == 1 or not call.recorded:
            return 0
        if self._chooser is None:
            if asked is None:
                return 0
            raise BadRequest(
                f"{BEST_OF_HEADER}: the proxy has no chooser (start it with --best-of-check "
                "or --best-of-judge)"
            )
        if not self._applies(call):
            return 0
        if asked is not None:
            return asked
        if not self._fraction or call.assignment.split != "prod":
            return 0
        # random() is in [0, 1): a fraction of 1 draws every qualifying call, 0 none.
        return self._candidates if random.random() < self._fraction else 0

    @staticmethod
    def _applies(call: CallInProgress) -> bool:
        """A chat call that opens its trajectory and samples one answer, not greedily."""
        if call.kind != "chat" or call.assignment.seq != 0 or call.assignment.new_rows is None:
            return False
        if call.guidance is not None:  # a guided retry samples its own group
            return False
        n, temperature = call.body.get("n"), call.body.get("temperature")
        if n not in (None, 1):
            return False
        return not (isinstance(temperature, int | float) and temperature <= 0)

    @staticmethod
    def upstream_body(sent: JsonObject, n: int) -> JsonObject:
        """The body that samples the N candidates: one call, whole (a stream is streamed after
        the choice)."""
        body = {key: value for key, value in sent.items() if key != "stream_options"}
        return body | {"n": n, "stream": False}

    async def choose(self, call: CallInProgress, answer: JsonObject, n: int) -> JsonObject:
        """Score the N choices of `answer`, record them as one judged group, and return the one
        to answer `call` with (a one-choice response)."""
        assert self._chooser is not None
        group = self._tracker.best_of_group(call.assignment, n)
        candidates = [
            Candidate(assignment, response)
            for assignment, response in zip(group, one_choice_each(answer), strict=True)
        ]
        messages: list[JsonObject] = list(call.body.get("messages") or [])
        started = time.perf_counter()
        judgment: Judgment | None = None
        try:
            judgment = await asyncio.wait_for(
                self._chooser.judge(group[0].group_id, messages, candidates), self._timeout_s
            )
        except TimeoutError:
            log.warning(
                "best-of chooser took over %g s: the first candidate is answered", self._timeout_s
            )
        except ChooserError as exc:
            log.warning("best-of chooser failed (%s): the first candidate is answered", exc)
        seconds = time.perf_counter() - started
        chosen = candidates[_best(judgment, candidates)]
        self._counters.best_of_calls += 1
        self._counters.best_of_candidates += n
        self._counters.best_of_choose_seconds += seconds
        if judgment is None or judgment.status != "scored":
            self._counters.best_of_unjudged += 1
        else:
            self._counters.best_of_judge_cost_usd += judgment.cost_usd
        await self._record(call, candidates, judgment)
        return chosen.response

    async def _record(
        self, call: CallInProgress, candidates: list[Candidate], judgment: Judgment | None
    ) -> None:
        """Each candidate as its own call; the judgment with the first (it needs only the group
        row before it). A record the store cannot keep is the recorder's to count and log."""
        recorded = []
        for i, candidate in enumerate(candidates):
            assignment = candidate.assignment
            if i == 0 and judgment is not None:
                assert assignment.new_rows is not None  # a candidate opens its trajectory
                rows = replace(assignment.new_rows, judgment=judgment_row(judgment))
                assignment = replace(assignment, new_rows=rows)
            sibling = CallInProgress(
                "chat", call.body, assignment, stream=False, model=call.model, asks=call.asks
            )
            recorded.append(
                self._recorder.record(sibling, Outcome("ok", 200, response=candidate.response))
            )
        await asyncio.gather(*recorded, return_exceptions=True)

    async def aclose(self) -> None:
        if self._chooser is not None:
            await self._chooser.aclose()


def _best(judgment: Judgment | None, candidates: Sequence[Candidate]) -> int:
    """The index of the best-scored candidate (the first of equals); 0 without scores."""
    if judgment is None or judgment.status != "scored":
        return 0
    reward = {score.trajectory_id: score.reward for score in judgment.scores}
    rewards = [reward.get(c.assignment.trajectory_id, -math.inf) for c in candidates]
    return max(range(len(candidates)), key=lambda i: (rewards[i], -i))


def one_choice_each(answer: JsonObject) -> list[JsonObject]:
    """An n-choice chat response as n one-choice responses, each with its own usage (vLLM sums
    `completion_tokens` over the choices; each gets its own count, from its ids where sent)."""
    choices = sorted(answer["choices"], key=lambda choice: choice.get("index", 0))
    usage = answer.get("usage")
    out = []
    for choice in choices:
        single = {**answer, "choices": [{**choice, "index": 0}]}
        if isinstance(usage, dict):
            ids = choice.get("token_ids")
            completion = (
                len(ids)
                if isinstance(ids, list)
                else round(usage.get("completion_tokens", 0) / max(len(choices), 1))
            )
            prompt = usage.get("prompt_tokens", 0)
            single["usage"] = {
                **usage,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
        out.append(single)
    return out


def stream_chunks(response: JsonObject, include_usage: bool) -> list[JsonObject]:
    """A one-choice chat response as the chunks vLLM would have streamed for it: the role, the
    reasoning and the text with the ids and logprobs, each tool call whole, the finish (and the
    usage when the client asked for it)."""
    head = {
        "id": response.get("id", ""),
        "object": "chat.completion.chunk",
        "created": response.get("created", 0),
        "model": response.get("model", ""),
    }
    choice = response["choices"][0]
    message = choice.get("message") or {}

    def chunk(delta: JsonObject, **extra: object) -> JsonObject:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, **extra}]}

    role = chunk({"role": "assistant", "content": ""}, logprobs=None)
    if response.get("prompt_token_ids") is not None:
        role["prompt_token_ids"] = response["prompt_token_ids"]
    chunks = [role]
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        chunks.append(chunk({"reasoning": reasoning}))
    text = chunk({"content": message.get("content") or ""}, logprobs=choice.get("logprobs"))
    if choice.get("token_ids") is not None:
        text["choices"][0]["token_ids"] = choice["token_ids"]
    chunks.append(text)
    for index, tool_call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{**tool_call, "index": index}]}))
    chunks.append(chunk({}, finish_reason=choice.get("finish_reason")))
    if include_usage and isinstance(response.get("usage"), dict):
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks


def best_of_chooser(
    settings: ProxySettings, store: TrajectoryStore, redactor: PiiRedactor | None = None
) -> Chooser | None:
    """The chooser the settings name (None: best-of-N is off); `ConfigError` for a check that
    cannot be loaded. `redactor` (`--redact-pii`): personal data replaced before a judge sees
    the candidates, as the offline judge does."""
    if settings.best_of_judge is not None:
        # Imported here: litellm's import costs seconds a proxy without a judge does not pay.
        from art_proxy.ruler.judge import LitellmJudge, litellm_token_counter
        from art_proxy.ruler.rubric import DEFAULT_RUBRIC
        from art_proxy.ruler.scorer import Ruler
        from art_proxy.ruler.settings import RulerSettings

        judge = LitellmJudge(
            settings.best_of_judge,
            base_url=settings.best_of_judge_base_url,
            timeout=settings.best_of_timeout,
        )
        # One answer, no retry: the user is waiting (a late judge is --best-of-timeout's).
        ruler_settings = RulerSettings(rubric=DEFAULT_RUBRIC, attempts=1, retries=0)
        counter = litellm_token_counter(settings.best_of_judge)
        ruler = Ruler(judge, store, ruler_settings, count_tokens=counter, redactor=redactor)
        return RulerChooser(ruler, [judge])
    if settings.best_of_check is not None:
        from art_proxy.loading import load_function

        spec = settings.best_of_check
        check = load_function(spec, "--best-of-check")
        if not callable(check):
            raise ConfigError(f"--best-of-check {spec!r} is not a function")
        return CheckChooser(spec, cast(Check, check))
    return None
