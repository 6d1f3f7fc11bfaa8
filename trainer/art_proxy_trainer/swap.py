"""Hot-swap: a new adapter reaches every upstream before any agent is sent to it.

The order is what makes a swap invisible to clients: load `alias@step-run` into every upstream (vLLM's
`/v1/load_lora_adapter`; each replica must be told itself), and only when all have it move the
proxy's alias, so no request can name an adapter some replica lacks. Adapters older than the last
`keep` are unloaded afterwards; a request still running on one finishes (the local server and vLLM
both keep an adapter alive for the rows that use it), and a proxy that has not yet seen the move
(they refresh every second) still names one of the kept ones. An adapter some alias on the proxy
points at (a production alias serving an older step), one an open trajectory's lease holds (the
proxy's `/art/v1/leases`: its calls stay on the adapter its first call got), one the trainer's own
rollouts call by name (`holding`: a validation beside the batches), or one in `pinned` (a
rollback target), is never unloaded: it stays until it is none of these and older than the last
`keep`. A trainer unloads only
adapters of its own run (named with the run's tag): an upstream shared by several proxies and stores
serves aliases this trainer cannot see, and an adapter of another run may be what one of them
serves. The tag also keeps this run's `alias@1` from meeting another run's. An upstream that
refuses the adapter leaves the alias where it was: the new adapter is unloaded from the upstreams
that took it, and the refusal is returned as data for the step's record.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from art_proxy.records import AliasRecord, AliasRequest, Lease, SwapStatus
from art_proxy_trainer.errors import BaseModelMismatch, SwapError

_TIMEOUT = aiohttp.ClientTimeout(total=120)
# vLLM's answer to loading a name twice; after a restart the upstream may still hold our adapter.
_ALREADY_LOADED = "has already been loaded"


@dataclass(frozen=True)
class SwapOutcome:
    status: SwapStatus
    error: str | None = None


def adapter_name(alias: str, step: int, run_tag: str) -> str:
    """`policy@12-3f9a1c`: the step first, for people reading it; `run_tag` empty gives the
    names of runs from before tags (`policy@12`)."""
    return f"{alias}@{step}-{run_tag}" if run_tag else f"{alias}@{step}"


def of_run(model: str, alias: str, run_tag: str) -> bool:
    """Whether `model` is one of the adapters a run tagged `run_tag` saved under `alias`."""
    return model.startswith(alias + "@") and model.endswith("-" + run_tag)


def step_of(model: str | None, alias: str) -> int:
    """The training step of the adapter a call was served by (0: the base model)."""
    prefix = alias + "@"
    if not model or not model.startswith(prefix):
        return 0
    step = model[len(prefix) :].split("-", 1)[0]
    return int(step) if step.isdigit() else 0


def step_of_run(model: str | None, alias: str, run_tag: str) -> int | None:
    """`step_of` for a model this run's weights served (an adapter of this run, the base
    model); None for an adapter of another run, whose weights lie on none of this run's steps."""
    step = step_of(model, alias)
    if step and model != adapter_name(alias, step, run_tag):
        return None
    return step


class AdapterSwapper:
    def __init__(
        self,
        *,
        upstreams: list[str],
        upstream_api_key: str | None,
        proxy: str,
        admin_key: str | None,
        alias: str | None,
        keep: int,
    ) -> None:
        # None: the name the upstreams serve the base model as (see check_base_model).
        self.alias = alias or ""
        self.base_name = ""  # what the upstreams serve the base model as
        self._upstreams = upstreams
        self._proxy = proxy.rstrip("/")
        self._upstream_headers = _bearer(upstream_api_key)
        self._admin_headers = _bearer(admin_key)
        self._keep = keep
        self.run_tag = ""  # the run's, set by the trainer once it knows which run it is
        self._loaded: deque[str] = deque()
        self._session: aiohttp.ClientSession | None = None
        self.pinned: set[str] = set()  # kept loaded though no alias points at them
        # Adapters the trainer's own rollouts name directly (a validation beside the batches):
        # a count each, as two validations may hold one adapter.
        self._held: Counter[str] = Counter()

    async def __aenter__(self) -> AdapterSwapper:
        self._session = aiohttp.ClientSession(timeout=_TIMEOUT)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def check_base_model(self, names: set[str]) -> str:
        """The name the upstreams serve the trainer's base model as; raises BaseModelMismatch
        when some upstream does not serve it (an adapter for another base would be garbage)."""
        served_as: str | None = None
        for upstream in self._upstreams:
            status, body = await self._request("GET", upstream + "/models", None, upstream=True)
            if status != 200:
                raise SwapError(f"upstream {upstream} answered {status} to GET /models: {body}")
            entries = orjson.loads(body).get("data", [])
            bases = [entry for entry in entries if entry.get("parent") is None]
            matching = [e for e in bases if _same_model(e, names)]
            if matching:
                served_as = served_as or str(matching[0]["id"])
            else:
                shown = ", ".join(sorted(str(entry.get("id")) for entry in bases)) or "nothing"
                raise BaseModelMismatch(
                    f"upstream {upstream} serves {shown}, but the trainer loaded "
                    f"{' / '.join(sorted(names))}: an adapter trained on another base model "
                    "would be garbage there (pass --model with the upstream's base model)"
                )
        assert served_as is not None  # at least one upstream, each matched
        self.base_name = served_as
        return served_as

    async def aliases(self) -> list[AliasRecord]:
        """Every alias on the proxy and what it serves."""
        status, body = await self._request("GET", self._proxy + "/art/v1/aliases", None)
        if status != 200:
            raise SwapError(f"the proxy answered {status} to GET /art/v1/aliases: {body}")
        return [AliasRecord.model_validate(item) for item in orjson.loads(body).get("data", [])]

    async def leased(self) -> set[str]:
        """The models open trajectories hold (the proxy's leases, every proxy's)."""
        status, body = await self._request("GET", self._proxy + "/art/v1/leases", None)
        if status != 200:
            raise SwapError(f"the proxy answered {status} to GET /art/v1/leases: {body}")
        return {Lease.model_validate(item).model for item in orjson.loads(body).get("data", [])}

    async def alias_target(self) -> AliasRecord | None:
        return next((r for r in await self.aliases() if r.alias == self.alias), None)

    async def move_alias(self, alias: str, move: AliasRequest) -> str | None:
        """Move an alias on the proxy; what the proxy answered when it refused (None: moved)."""
        status, body = await self._request(
            "PUT", f"{self._proxy}/art/v1/aliases/{alias}", move.model_dump(mode="json")
        )
        return None if status == 200 else f"the proxy answered {status} to moving {alias}: {body}"

    def holds(self, model: str) -> bool:
        """Every upstream serves `model`: the base, or one of our adapters loaded everywhere."""
        return model == self.base_name or model in self._loaded

    async def serve_base(self) -> None:
        """Point the alias at the base model and unload this run's adapters an earlier start left
        upstream (a restart from scratch in the same directory): a new run starts from the base.
        Adapters of other runs stay: another proxy's alias may serve one."""
        current = await self.alias_target()
        if current is not None and current.model != self.base_name:
            error = await self.move_alias(
                self.alias, AliasRequest(model=self.base_name, step=None, reason="swap")
            )
            if error is not None:
                raise SwapError(error)
        for upstream in self._upstreams:
            status, body = await self._request("GET", upstream + "/models", None, upstream=True)
            if status != 200:
                continue
            for entry in orjson.loads(body).get("data", []):
                name = str(entry.get("id"))
                if self.run_tag and of_run(name, self.alias, self.run_tag):
                    await self._request(
                        "POST",
                        upstream + "/unload_lora_adapter",
                        {"lora_name": name},
                        upstream=True,
                    )

    def adapter_name(self, step: int) -> str:
        return adapter_name(self.alias, step, self.run_tag)

    async def swap(self, step: int, adapter_dir: Path) -> SwapOutcome:
        name = self.adapter_name(step)
        results = await asyncio.gather(
            *(self._load(upstream, name, adapter_dir) for upstream in self._upstreams)
        )
        refused = [error for error in results if error is not None]
        if refused:
            await self._unload_everywhere(name)
            return SwapOutcome("rejected", "; ".join(refused))
        error = await self.move_alias(
            self.alias, AliasRequest(model=name, step=step, reason="swap")
        )
        if error is not None:
            await self._unload_everywhere(name)
            return SwapOutcome("rejected", error)
        if name not in self._loaded:
            self._loaded.append(name)
        await self._unload_beyond_keep()
        return SwapOutcome("swapped")

    @property
    def serving(self) -> str:
        """What the alias serves now: the newest adapter swapped in, else the base model."""
        return self._loaded[-1] if self._loaded else self.base_name

    @contextlib.contextmanager
    def holding(self, name: str) -> Iterator[None]:
        """Keep `name` loaded while the block runs (rollouts that call it by name)."""
        self._held[name] += 1
        try:
            yield
        finally:
            self._held[name] -= 1
            if not self._held[name]:
                del self._held[name]

    @property
    def loaded(self) -> list[str]:
        """Our adapters loaded upstream, oldest first."""
        return list(self._loaded)

    def adopt(self, names: list[str]) -> None:
        """Adapters a previous run of this trainer left loaded (oldest first): unloaded in turn."""
        for name in names:
            if name not in self._loaded:
                self._loaded.append(name)

    async def _unload_beyond_keep(self) -> None:
        """Unload adapters older than the last `keep`, except those an alias (its target or its
        canary), an open trajectory's lease or `pinned` holds."""
        beyond = list(self._loaded)[: max(0, len(self._loaded) - self._keep)]
        if not beyond:
            return
        try:
            records = await self.aliases()
            # A running canary's candidate serves its share of the alias: held like the target.
            aliased = {record.model for record in records} | {
                record.canary for record in records if record.canary is not None
            }
            pinned = self.pinned | set(self._held) | aliased | await self.leased()
        except SwapError:
            return  # pins unknown: a spare adapter costs memory, a pinned one gone fails calls
        for name in beyond:
            if name not in pinned:
                await self._unload_everywhere(name)
                self._loaded.remove(name)

    async def _load(self, upstream: str, name: str, adapter_dir: Path) -> str | None:
        # Absolute (Checkpoints resolves its directory): the upstream runs elsewhere.
        body = {"lora_name": name, "lora_path": str(adapter_dir)}
        try:
            status, text = await self._request(
                "POST", upstream + "/load_lora_adapter", body, upstream=True
            )
        except SwapError as exc:
            return str(exc)
        if status == 200 or (status == 400 and _ALREADY_LOADED in text):
            return None
        return f"upstream {upstream} refused adapter {name} ({status}): {text[:500]}"

    async def _unload_everywhere(self, name: str) -> None:
        # Best effort: an adapter left loaded costs memory, not correctness.
        for upstream in self._upstreams:
            try:
                await self._request(
                    "POST", upstream + "/unload_lora_adapter", {"lora_name": name}, upstream=True
                )
            except SwapError:
                continue

    async def _request(
        self, method: str, url: str, body: Any, *, upstream: bool = False
    ) -> tuple[int, str]:
        assert self._session is not None, "use `async with AdapterSwapper(...)`"
        headers = self._upstream_headers if upstream else self._admin_headers
        if body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        try:
            async with self._session.request(
                method, url, data=None if body is None else orjson.dumps(body), headers=headers
            ) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SwapError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc


def _same_model(entry: dict[str, Any], names: set[str]) -> bool:
    """A /v1/models base entry names the model by its served id or its root (a path or a hub
    id): a match of the last path component (`Qwen/Qwen2.5-7B` and `/models/Qwen2.5-7B`) counts.
    """
    served = {str(entry.get("id")), str(entry.get("root"))}
    return bool(served & names) or bool({_stem(n) for n in served} & {_stem(n) for n in names})


def _stem(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")


def _bearer(key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers
