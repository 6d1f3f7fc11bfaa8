"""The floor of any relaying proxy on this machine: aiohttp in, aiohttp out, nothing else.

`proxy_overhead.py` starts it beside art-proxy as the `bare relay` target: a generation call's
body goes to the upstream as received and its answer comes back as the upstream sent it, over one
pooled client session, on uvloop, as art-proxy's HTTP runs. Nothing is parsed, checked, recorded
or journaled, so what art-proxy adds beyond this relay is its own work, and what this relay adds
to a direct call is what any aiohttp proxy pays on the machine in that minute.

    .venv/bin/python benchmarks/bare_relay.py --port 8200 --upstream http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Sequence

import aiohttp
import uvloop
from aiohttp import web

_CLIENT = web.AppKey("client", aiohttp.ClientSession)


def create_app(upstream: str) -> web.Application:
    app = web.Application()

    async def client(app: web.Application) -> AsyncIterator[None]:
        app[_CLIENT] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[_CLIENT].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "application/json"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        path = request.match_info["path"]
        async with request.app[_CLIENT].post(
            f"{upstream}/{path}", data=await request.read(), headers=headers
        ) as answer:
            if answer.content_type != "text/event-stream":
                body = await answer.read()
                return web.Response(
                    body=body, status=answer.status, content_type=answer.content_type
                )
            response = web.StreamResponse(status=answer.status)
            response.content_type = answer.content_type
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.cleanup_ctx.append(client)
    app.router.add_post("/v1/{path:.+}", relay)
    app.router.add_get("/health", health)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's /v1 base URL")
    args = parser.parse_args(argv)
    web.run_app(
        create_app(args.upstream.rstrip("/")),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
