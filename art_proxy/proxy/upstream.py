"""The inference upstreams: one pooled HTTP session, errors translated once, capabilities learnt.

Connection failures become `UpstreamError` (502) and silence past the timeout `UpstreamTimeout` (504),
statuses the OpenAI SDK retries. An upstream that rejects `return_token_ids` (a hosted API used for a
prompted baseline) is remembered, and its calls are recorded as text only, not trainable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import aiohttp
import orjson
from aiohttp import web

from art_proxy.errors import UpstreamError, UpstreamTimeout
from art_proxy.records import CallKind, JsonObject

# Where each kind of generation call goes below an upstream's /v1 base URL.
PATHS: dict[CallKind, str] = {"chat": "/chat/completions", "completion": "/completions"}
# Generous: a pool per upstream host, shared by every agent behind the proxy.
_CONNECTIONS_PER_UPSTREAM = 512
_CONNECT_TIMEOUT_S = 10.0


class Upstreams:
    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None,
        timeout_s: float,
        pass_client_key: bool = True,
    ) -> None:
        self.urls = urls
        self._api_key = api_key
        # A client's own key goes upstream only through an open proxy: behind --api-key it is ours.
        self._pass_client_key = pass_client_key
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=timeout_s or None
        )
        self._session: aiohttp.ClientSession | None = None
        self._without_token_ids: set[str] = set()

    async def __aenter__(self) -> Upstreams:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=_CONNECTIONS_PER_UPSTREAM)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=True,
            # One session serves every agent: a cookie one answer sets (a CDN's, before a hosted
            # API) must not ride along on other agents' calls.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    def returns_token_ids(self, upstream: str) -> bool:
        return upstream not in self._without_token_ids

    def mark_without_token_ids(self, upstream: str) -> None:
        self._without_token_ids.add(upstream)

    def _headers(self, client_authorization: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif client_authorization and self._pass_client_key:
            headers["Authorization"] = client_authorization
        return headers

    async def post(
        self,
        upstream: str,
        path: str,
        body: JsonObject,
        client_authorization: str | None,
        trace: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """Send `body`; the caller reads (and releases) the response. `trace`: the client's W3C
        Trace Context headers, passed on so that vLLM's own spans join the client's trace."""
        headers = self._headers(client_authorization) | dict(trace or {})
        return await self._request("POST", upstream, path, orjson.dumps(body), headers)

    async def get(
        self, upstream: str, path: str, client_authorization: str | None
    ) -> aiohttp.ClientResponse:
        return await self._request("GET", upstream, path, None, self._headers(client_authorization))

    async def _request(
        self, method: str, upstream: str, path: str, data: bytes | None, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        assert self._session is not None, "use `async with Upstreams(...)`"
        try:
            return await self._session.request(method, upstream + path, data=data, headers=headers)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {upstream} did not answer in time") from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(
                f"upstream {upstream} refused the connection: {exc.os_error}"
            ) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"upstream {upstream} failed: {type(exc).__name__}: {exc}") from exc


async def read_body(upstream: str, response: aiohttp.ClientResponse) -> bytes:
    """The whole body, with read failures translated like request failures."""
    try:
        return await response.read()
    except TimeoutError as exc:
        raise UpstreamTimeout(f"upstream {upstream} did not answer in time") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(f"upstream {upstream} broke off: {type(exc).__name__}: {exc}") from exc
    finally:
        response.release()


def client_auth(request: web.Request) -> str | None:
    """The client's key, for the upstream: Anthropic's SDKs send it as `x-api-key`."""
    authorization = request.headers.get("Authorization")
    if authorization is None and "x-api-key" in request.headers:
        return f"Bearer {request.headers['x-api-key']}"
    return authorization
