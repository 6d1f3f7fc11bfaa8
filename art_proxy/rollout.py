"""The rollout runner: an async agent, run `group_size` times on every scenario through the proxy.

Each scenario's batch of rollouts is one group (a fresh group id per run), which is what RULER ranks
and GRPO learns from. Each rollout gets its own base URL,
`{proxy}/scenario/{scenario}/group/{group}/trajectory/{trajectory}/split/{split}/v1`, so every call
the agent makes through it lands in that trajectory and split; the same travel as `X-Art-*` headers
too, which `Rollout.openai_client()` sends (a guided retry's guidance travels only there).

When the agent returns, the runner finishes the trajectory with the reward it returned. A bad rollout
is data, not a crash: an agent that raises or runs past the timeout leaves a finished trajectory
whose metadata holds `rollout_error`, which judging leaves out, and the other rollouts go on. A
rollout cancelled (a trainer shutting down) finishes its trajectory the same way before it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

import aiohttp

from art_proxy.errors import ConfigError, exception_text
from art_proxy.ids import new_id
from art_proxy.loading import is_async_callable, load_function
from art_proxy.records import ROLLOUT_ERROR, JsonObject, Split, TrajectoryRecord
from art_proxy.scenarios import Scenario

if TYPE_CHECKING:
    import openai

__all__ = [
    "CANCELLED",
    "Agent",
    "AgentResult",
    "GroupReport",
    "Rollout",
    "RolloutOutcome",
    "RolloutReport",
    "load_agent",
    "load_function",
    "ready_for_judging",
    "run_rollouts",
    "trajectory_base_url",
]

# Seconds to wait for the proxy's admin endpoints (a finish is one small transaction).
_ADMIN_TIMEOUT_S = 30.0
# A cancelled rollout's finish: short, as whoever cancelled it is shutting down.
_CANCELLED_FINISH_S = 5.0
# The `rollout_error` of a rollout cancelled before its agent returned.
CANCELLED = "cancelled before the agent returned"


@dataclass(frozen=True)
class RolloutOutcome:
    """What an agent may return instead of a bare reward."""

    reward: float | None = None  # None: no programmatic reward (RULER judges)
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class Rollout:
    """One run of the agent on one scenario: where to send its calls and under which names."""

    scenario: Scenario
    proxy_url: str  # the proxy's root URL (its `/art/` endpoints)
    trajectory_id: str
    group_id: str
    index: int  # 0 .. group_size - 1 within its group
    model: str  # the model name to call: the alias the trainer moves
    api_key: str = "unused"  # the proxy's client key
    # A guided retry's hint: the proxy adds it to the prompt upstream, the trainer leaves it out.
    guidance: str | None = None
    split: Split | None = None  # recorded under this split (None: the scenario's)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL of this trajectory, ending in /v1: its scenario, group, id and
        split ride in the path, so an agent that only sets a base URL is attributed too (an
        evaluation's rollouts recorded as such, never trained on)."""
        return trajectory_base_url(
            self.proxy_url,
            self.scenario.id,
            self.group_id,
            self.trajectory_id,
            self.split or self.scenario.split,
        )

    @property
    def headers(self) -> dict[str, str]:
        """The attribution as `X-Art-*` headers; the split and a guided retry's guidance travel
        only here."""
        headers = {
            "X-Art-Scenario": self.scenario.id,
            "X-Art-Group": self.group_id,
            "X-Art-Trajectory": self.trajectory_id,
            "X-Art-Split": self.split or self.scenario.split,
        }
        if self.guidance is not None:
            headers["X-Art-Guidance"] = quote(self.guidance, safe="")
        return headers

    def openai_client(self, **options: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` for this rollout: its base URL, key and headers."""
        import openai  # the SDK comes with litellm; imported only by agents that use it

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, default_headers=self.headers, **options
        )


AgentResult = float | RolloutOutcome | None
Agent = Callable[[Rollout], Awaitable[AgentResult]]


@dataclass
class GroupReport:
    """One scenario's batch of rollouts: one group in the store."""

    group_id: str
    scenario_id: str
    split: Split
    trajectory_ids: list[str]
    rewards: dict[str, float | None] = field(default_factory=dict)
    # What the agent reported of each rollout besides its reward (tool calls, turns...).
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # the agent raised or timed out
    seconds: dict[str, float] = field(default_factory=dict)  # each rollout's, from start to end
    timed_out: list[str] = field(default_factory=list)  # of `errors`, those cut by the timeout
    # Finished trajectories the store did not get: the agent made no call, or the finish failed.
    unrecorded: dict[str, str] = field(default_factory=dict)

    @property
    def succeeded(self) -> list[str]:
        """Rollouts the agent completed whose trajectory is in the store."""
        return [
            id_
            for id_ in self.trajectory_ids
            if id_ not in self.errors and id_ not in self.unrecorded
        ]


def ready_for_judging(group: GroupReport) -> bool:
    """A group is judged when at least two of its rollouts succeeded."""
    return len(group.succeeded) >= 2


@dataclass
class RolloutReport:
    groups: list[GroupReport]
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def rollouts(self) -> int:
        return sum(len(group.trajectory_ids) for group in self.groups)

    @property
    def failed(self) -> int:
        """Rollouts whose agent raised or timed out."""
        return sum(len(group.errors) for group in self.groups)

    @property
    def timed_out(self) -> int:
        return sum(len(group.timed_out) for group in self.groups)


def trajectory_base_url(
    proxy_url: str, scenario: str, group: str, trajectory: str, split: str | None = None
) -> str:
    ids = (quote(part, safe="") for part in (scenario, group, trajectory))
    url = "{}/scenario/{}/group/{}/trajectory/{}".format(proxy_url.rstrip("/"), *ids)
    return f"{url}/split/{quote(split, safe='')}/v1" if split else f"{url}/v1"


async def run_rollouts(
    agent: Agent,
    scenarios: Sequence[Scenario],
    *,
    proxy_url: str,
    group_size: int,
    concurrency: int,
    timeout_s: float,
    model: str,
    api_key: str | None = None,
    admin_key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    guidance: Mapping[str, str] | None = None,
    group_ids: Mapping[str, str] | None = None,
    groups_out: list[GroupReport] | None = None,
    split: Split | None = None,
) -> RolloutReport:
    """Run `agent` `group_size` times on every scenario, at most `concurrency` at once.

    `timeout_s` bounds each rollout (0 = no bound). `progress(done, total)` is called as rollouts
    end. `guidance` (scenario id -> text) makes the scenarios it names guided retries.
    `group_ids` (scenario id -> group id) names the groups, so that several runs (an
    evaluation's arms) share one a scenario; `groups_out` gets the groups as they are made, so a
    caller that is cancelled still holds the rollouts that ended; `split` records every rollout
    under it instead of its scenario's. Raises
    `ConfigError` before running anything when the proxy cannot be reached or refuses
    `admin_key`.
    """
    if group_size < 1 or concurrency < 1:
        raise ValueError("group_size and concurrency must be at least 1")
    proxy_url = proxy_url.rstrip("/").removesuffix("/v1")
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    timeout = aiohttp.ClientTimeout(total=_ADMIN_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        await _check_proxy(http, proxy_url)
        runner = _Runner(agent, http, proxy_url, timeout_s, asyncio.Semaphore(concurrency))
        groups = [
            _new_group(scenario, group_size, (group_ids or {}).get(scenario.id), split)
            for scenario in scenarios
        ]
        if groups_out is not None:
            groups_out += groups
        rollouts = [
            Rollout(
                scenario=scenario,
                proxy_url=proxy_url,
                trajectory_id=trajectory,
                group_id=group.group_id,
                index=index,
                model=model,
                api_key=api_key or "unused",
                guidance=(guidance or {}).get(scenario.id),
                split=split,
            )
            for scenario, group in zip(scenarios, groups, strict=True)
            for index, trajectory in enumerate(group.trajectory_ids)
        ]
        by_id = {group.group_id: group for group in groups}
        done = 0

        async def one(rollout: Rollout) -> None:
            nonlocal done
            await runner.run(rollout, by_id[rollout.group_id])
            done += 1
            if progress is not None:
                progress(done, len(rollouts))

        async with asyncio.TaskGroup() as tasks:
            for rollout in rollouts:
                tasks.create_task(one(rollout))
    return RolloutReport(groups, time.monotonic() - started, runner.warnings)


def _new_group(
    scenario: Scenario, size: int, group_id: str | None, split: Split | None
) -> GroupReport:
    return GroupReport(
        group_id=group_id or new_id(),
        scenario_id=scenario.id,
        split=split or scenario.split,
        trajectory_ids=[new_id() for _ in range(size)],
    )


async def _check_proxy(http: aiohttp.ClientSession, proxy_url: str) -> None:
    """Fail before any agent runs when the proxy is down or the admin key is wrong."""
    url = f"{proxy_url}/art/v1/trajectories?limit=1"
    try:
        async with http.get(url) as response:
            if response.status in (401, 403):
                given = "refused the admin key given" if http.headers else "wants its admin key"
                raise ConfigError(f"the proxy at {proxy_url} {given} (--admin-key)")
            if response.status != 200:
                raise ConfigError(f"{url} answered HTTP {response.status}: is it art-proxy?")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConfigError(f"the proxy at {proxy_url} is unreachable: {_describe(exc)}") from exc


class _Runner:
    def __init__(
        self,
        agent: Agent,
        http: aiohttp.ClientSession,
        proxy_url: str,
        timeout_s: float,
        semaphore: asyncio.Semaphore,
    ) -> None:
        self._agent = agent
        self._http = http
        self._proxy_url = proxy_url
        self._timeout_s = timeout_s
        self._semaphore = semaphore
        self._misfiled: set[str] = set()
        self.warnings: list[str] = []

    async def run(self, rollout: Rollout, group: GroupReport) -> None:
        trajectory = rollout.trajectory_id
        async with self._semaphore:
            started = time.perf_counter()
            try:
                outcome, error = await self._call_agent(rollout)
            except asyncio.CancelledError:
                # Left open, its trajectory would hold its adapter's lease (and keep the
                # trainer from unloading it) until the proxy's idle timeout, with 0 forever.
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    async with asyncio.timeout(_CANCELLED_FINISH_S):
                        await self._finish(rollout, group, {"metadata": {ROLLOUT_ERROR: CANCELLED}})
                raise
            group.seconds[trajectory] = time.perf_counter() - started
        if error is not None:
            group.errors[trajectory] = error
            if error.startswith("timeout after"):
                group.timed_out.append(trajectory)
            body: JsonObject = {"metadata": {ROLLOUT_ERROR: error}}
        else:
            body = {
                "reward": outcome.reward,
                "metrics": outcome.metrics,
                "metadata": outcome.metadata,
            }
            group.rewards[trajectory] = outcome.reward
            group.metrics[trajectory] = dict(outcome.metrics)
        await self._finish(rollout, group, body)

    async def _call_agent(self, rollout: Rollout) -> tuple[RolloutOutcome, str | None]:
        try:
            async with asyncio.timeout(self._timeout_s or None):
                result = await self._agent(rollout)
        except TimeoutError:
            return RolloutOutcome(), f"timeout after {self._timeout_s:g}s"
        except Exception as exc:  # a bad rollout is data, not a crash
            return RolloutOutcome(), _describe(exc)
        try:
            return _outcome(result), None
        except TypeError as exc:
            return RolloutOutcome(), _describe(exc)

    async def _finish(self, rollout: Rollout, group: GroupReport, body: JsonObject) -> None:
        trajectory = rollout.trajectory_id
        url = f"{self._proxy_url}/art/v1/trajectories/{quote(trajectory, safe='')}/finish"
        try:
            async with self._http.post(url, json=body) as response:
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            group.unrecorded[trajectory] = f"finish failed: {_describe(exc)}"
            return
        if response.status == 404:
            group.unrecorded[trajectory] = "the agent made no call through rollout.base_url"
        elif response.status != 200:
            group.unrecorded[trajectory] = f"finish failed: HTTP {response.status}: {text[:200]}"
        else:
            self._check_split(group, TrajectoryRecord.model_validate_json(text))

    def _check_split(self, group: GroupReport, recorded: TrajectoryRecord) -> None:
        # The URL carries scenario, group and trajectory; only the headers carry the split.
        if recorded.split != group.split and group.group_id not in self._misfiled:
            self._misfiled.add(group.group_id)
            self.warnings.append(
                f"scenario {group.scenario_id!r} was recorded as split {recorded.split!r}, not "
                f"{group.split!r}: the agent's client must send rollout.headers"
            )


def _outcome(result: object) -> RolloutOutcome:
    if result is None:
        return RolloutOutcome()
    if isinstance(result, RolloutOutcome):
        outcome = result
    elif isinstance(result, int | float) and not isinstance(result, bool):
        outcome = RolloutOutcome(reward=float(result))
    else:
        raise TypeError(
            f"the agent returned {type(result).__name__}, not a float, RolloutOutcome or None"
        )
    if outcome.reward is not None and not math.isfinite(outcome.reward):
        raise TypeError(f"the agent returned a reward of {outcome.reward}, not a finite number")
    return outcome


def _describe(exc: BaseException) -> str:
    return exception_text(exc)


def load_agent(spec: str) -> Agent:
    """The async function named by `module.path:function` or `path/to/file.py:function`
    (see `load_function`), or a command, `exec:COMMAND` (see command_agent.py)."""
    from art_proxy.command_agent import PREFIX, command_agent  # it imports this module

    if spec.startswith(PREFIX):
        return command_agent(spec)
    agent = load_function(spec, "agent")
    if not is_async_callable(agent):
        name = spec.rpartition(":")[2]
        raise ConfigError(f"agent {spec!r} is not an async function (async def {name}(rollout))")
    return cast(Agent, agent)
