"""LangGraph / LangChain: one trajectory per root run, finished when the run ends.

`ArtProxyCallback` is a LangChain callback handler. When a root run starts (a graph's `invoke`,
`ainvoke` or `astream`, or any runnable called with the handler in its config) it opens a
trajectory: a fresh id, held in a context variable that LangGraph carries into its nodes, tools and
streams (asyncio tasks and executor threads copy the context they start in). The chat model built
by `chat_model` reads that variable in an httpx request hook and sends it as `X-Art-*` headers, so
every LLM call of the run files under the run's trajectory. When the root run ends (or fails) the
handler finishes the trajectory through `POST /art/v1/trajectories/{id}/finish`, with the reward of
`reward_fn(outputs)` or of `set_reward(...)` called inside the run; a failure is recorded in the
metadata (`error`).

A run tagged `art:subagent` (`subagent.with_config(tags=[SUBAGENT_TAG])`) below a root opens its
own trajectory, so a sub-agent's calls stay apart from its caller's; LangChain passes tags down, so
the whole sub-tree of that run belongs to the sub-agent. Its scenario is the caller's plus
`/<run name>` (a sub-agent's trajectories must not be judged against the main agent's).

The handler methods run inline (`run_inline`): only then does a variable set in `on_chain_start`
reach the code that runs after it. A finished trajectory stays in the variable of contexts that
copied it; the hook skips finished ones and walks up to the caller's, so nothing needs resetting.

Per-run overrides travel as run metadata: `config={"metadata": {"art_scenario": ...,
"art_trajectory": ..., "art_group": ...}}`.
"""

from __future__ import annotations

import contextvars
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from art_proxy_integrations.headers import Split, attribution_headers

try:
    import httpx
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import BaseMessage
    from langchain_core.outputs import LLMResult
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "art_proxy_integrations.langgraph needs LangChain: "
        "pip install 'art-proxy-integrations[langgraph]'"
    ) from exc

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = ["SUBAGENT_TAG", "ArtProxyCallback", "chat_model", "current_trajectory_id", "set_reward"]

SUBAGENT_TAG = "art:subagent"
_FINISH_TIMEOUT_S = 10.0  # a finish is one small UPDATE; longer means the proxy is unreachable

logger = logging.getLogger(__name__)

RewardFn = Callable[[Any], float | None]


@dataclass
class _Trajectory:
    """One open trajectory: the root run (or sub-agent run) that owns it and what to finish with."""

    id: str
    scenario: str | None
    group: str | None
    split: Split
    parent: _Trajectory | None
    subagent: bool
    finished: bool = False
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        headers = attribution_headers(self.scenario, self.id, self.split)
        if self.group is not None:
            headers["X-Art-Group"] = self.group
        return headers


_current: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar(
    "art_proxy_trajectory", default=None
)


def _open_trajectory() -> _Trajectory | None:
    """The innermost trajectory of this context that has not finished yet."""
    trajectory = _current.get()
    while trajectory is not None and trajectory.finished:
        trajectory = trajectory.parent
    return trajectory


def current_trajectory_id() -> str | None:
    """The id of the trajectory the current run files its calls under (None outside a run)."""
    trajectory = _open_trajectory()
    return trajectory.id if trajectory is not None else None


def set_reward(
    reward: float | None,
    *,
    metrics: Mapping[str, float] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Attach a reward (and metrics, metadata) to the current run's trajectory, from inside the run
    (a node or a tool); it is sent when the run ends. Outside a run it raises `LookupError`."""
    trajectory = _open_trajectory()
    if trajectory is None:
        raise LookupError("set_reward() called outside a run traced by ArtProxyCallback")
    trajectory.reward = reward
    trajectory.metrics.update(metrics or {})
    trajectory.metadata.update(metadata or {})


class ArtProxyCallback(BaseCallbackHandler):
    """Opens a trajectory per root run and finishes it when the run ends.

    `proxy_url` is the proxy's root (`http://127.0.0.1:8100`, a trailing `/v1` is ignored);
    `scenario` names the scenario of every run (None: the proxy derives it from the conversation's
    opening); `reward_fn(outputs)` gives the reward when the root run ends (None: leave it to RULER
    or to `set_reward`); `admin_key` authenticates the finish call where the proxy has one.
    """

    run_inline = True
    raise_error = False  # a finish that fails is logged; it must not fail the agent's run

    def __init__(
        self,
        proxy_url: str,
        scenario: str | None = None,
        split: Split = "train",
        admin_key: str | None = None,
        reward_fn: RewardFn | None = None,
    ) -> None:
        self.proxy_url = proxy_url.rstrip("/").removesuffix("/v1")
        self.scenario = scenario
        self.split = split
        self.admin_key = admin_key
        self.reward_fn = reward_fn
        # Runs that opened a trajectory (roots and sub-agents), by run id, until they end.
        self._owners: dict[UUID, _Trajectory] = {}

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        caller = _open_trajectory() if parent_run_id is not None else None
        subagent = caller is not None and SUBAGENT_TAG in (tags or []) and not caller.subagent
        if caller is None or subagent:
            self._open(run_id, caller, metadata or {}, subagent, kwargs.get("name"))

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A chat model called on its own (no graph around it) is a root run too."""
        if parent_run_id is None:
            self._open(run_id, None, metadata or {}, False, None)

    def _open(
        self,
        run_id: UUID,
        caller: _Trajectory | None,
        metadata: dict[str, Any],
        subagent: bool,
        name: str | None,
    ) -> None:
        scenario = metadata.get("art_scenario", self.scenario)
        if subagent and caller is not None and caller.scenario is not None:
            scenario = f"{caller.scenario}/{name or 'subagent'}"
        trajectory = _Trajectory(
            id=str(metadata.get("art_trajectory") or uuid.uuid4().hex),
            scenario=scenario,
            group=metadata.get("art_group"),
            split=self.split,
            parent=caller,
            subagent=subagent,
        )
        self._owners[run_id] = trajectory
        _current.set(trajectory)

    async def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        await self._end(run_id, outputs, None)

    async def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        await self._end(run_id, response, None)

    async def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        await self._end(run_id, None, error)

    # A model run that fails ends what it opened as a chain does; LangChain calls both alike.
    on_llm_error = on_chain_error

    async def _end(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        trajectory = self._owners.pop(run_id, None)
        if trajectory is None:
            return  # a run inside a trajectory, not the one that opened it
        if error is not None:
            trajectory.metadata["error"] = f"{type(error).__name__}: {error}"
        elif self.reward_fn is not None and trajectory.reward is None:
            try:
                trajectory.reward = self.reward_fn(outputs)
            except Exception as exc:  # a bad reward is data: finish without it, say why
                trajectory.metadata["reward_error"] = f"{type(exc).__name__}: {exc}"
        await self._finish(trajectory)

    async def _finish(self, trajectory: _Trajectory) -> None:
        trajectory.finished = True
        body = {
            "reward": trajectory.reward,
            "metrics": trajectory.metrics,
            "metadata": trajectory.metadata,
        }
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        url = f"{self.proxy_url}/art/v1/trajectories/{trajectory.id}/finish"
        try:
            async with httpx.AsyncClient(timeout=_FINISH_TIMEOUT_S) as client:
                response = await client.post(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            logger.warning("finishing trajectory %s failed: %r", trajectory.id, exc)
            return
        if response.status_code == 404:
            return  # the run made no LLM call, so the proxy never opened this trajectory
        if response.is_error:
            logger.warning(
                "finishing trajectory %s failed: HTTP %s %s",
                trajectory.id,
                response.status_code,
                response.text[:200],
            )


def _add_headers(request: httpx.Request) -> None:
    trajectory = _open_trajectory()
    if trajectory is not None:
        request.headers.update(trajectory.headers())


async def _add_headers_async(request: httpx.Request) -> None:
    _add_headers(request)


def chat_model(
    proxy_url: str,
    model: str,
    *,
    http_client: httpx.Client | None = None,
    http_async_client: httpx.AsyncClient | None = None,
    **chat_openai_kwargs: Any,
) -> ChatOpenAI:
    """A `ChatOpenAI` that calls the proxy and sends the current run's `X-Art-*` headers.

    The headers come from the run an `ArtProxyCallback` opened (pass the handler in the graph's
    `config={"callbacks": [handler]}`); outside a run the proxy attributes calls automatically.
    Pass your own `http_client` / `http_async_client` to control their lifetime; the hook is added
    to them.
    """
    from langchain_openai import ChatOpenAI

    sync_client = http_client or httpx.Client()
    async_client = http_async_client or httpx.AsyncClient()
    sync_client.event_hooks["request"].append(_add_headers)
    async_client.event_hooks["request"].append(_add_headers_async)
    chat_openai_kwargs.setdefault("api_key", "unused")
    return ChatOpenAI(
        model=model,
        base_url=proxy_url.rstrip("/").removesuffix("/v1") + "/v1",
        http_client=sync_client,
        http_async_client=async_client,
        **chat_openai_kwargs,
    )
