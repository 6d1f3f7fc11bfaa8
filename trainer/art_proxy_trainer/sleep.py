"""vLLM's sleep mode around a training step, for one GPU shared by the whole loop.

While the trainer steps, vLLM need not serve: `POST /sleep?level=1` moves its weights to host memory
and drops its KV cache, giving the trainer the GPU memory they held; `POST /wake_up` brings them
back before the next rollouts. The routes are vLLM's server-level ones (beside `/v1`, not under it)
and exist only when vLLM runs with `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`
(`art-proxy up --sleep-mode` sets both). Only the whole loop sleeps its upstream: the sidecar
trains beside production traffic, which a sleeping vLLM would not answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType

import aiohttp

from art_proxy_trainer.errors import SleepError

_TIMEOUT = aiohttp.ClientTimeout(total=300)  # a wake-up copies the weights back


def server_root(upstream: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000`: where vLLM's sleep routes live."""
    return upstream.rstrip("/").removesuffix("/v1")


class UpstreamSleep:
    def __init__(self, upstreams: list[str], api_key: str | None = None) -> None:
        self._roots = [server_root(upstream) for upstream in upstreams]
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> UpstreamSleep:
        self._session = aiohttp.ClientSession(timeout=_TIMEOUT, headers=self._headers)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def check(self) -> None:
        """Raises SleepError unless every upstream offers sleep mode (at start, in one line)."""
        for root in self._roots:
            status = await self._call("GET", f"{root}/is_sleeping")
            if status != 200:
                raise SleepError(
                    f"--sleep-upstreams: {root}/is_sleeping answered {status}: start vLLM with "
                    "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (up --sleep-mode does both)"
                )

    @asynccontextmanager
    async def asleep(self) -> AsyncIterator[None]:
        """Every upstream asleep (level 1) for the block, awake again after it, whatever it
        raised."""
        for root in self._roots:
            await self._expect_ok("POST", f"{root}/sleep?level=1")
        try:
            yield
        finally:
            for root in self._roots:
                await self._expect_ok("POST", f"{root}/wake_up")

    async def _expect_ok(self, method: str, url: str) -> None:
        status = await self._call(method, url)
        if status != 200:
            raise SleepError(f"{method} {url} answered {status}")

    async def _call(self, method: str, url: str) -> int:
        assert self._session is not None, "use `async with UpstreamSleep(...)`"
        try:
            async with self._session.request(method, url) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SleepError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
