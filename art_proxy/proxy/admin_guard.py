"""What guards the admin API and the dashboard from other machines, from a web page and from input
the store cannot take.

Without `--admin-key` (with one, the key decides) they answer only clients on this machine (a
loopback peer; `--open-admin` serves them to anyone who can reach the port), where a browser is
the other party: a web page can call `/art/v1` two ways. A cross-site form or `fetch` can POST a body without CORS's
preflight when its type is `text/plain` or a form's, so a state-changing admin request must carry
JSON (`Content-Type: application/json`, which no page can send cross-origin without a preflight
this proxy never answers) and, when a browser names its `Origin`, come from the proxy's own. DNS
rebinding points a page's own name at 127.0.0.1, so its requests are same-origin: they still name
that page's host in `Host`, which must be one this proxy serves (loopback names, the bound
address, `--allowed-hosts`) while the admin API has no key.

Identifiers and query values reach the store's queries: a NUL, which PostgreSQL refuses in text,
is a 400 naming the field on both stores, as is a page offset past a 64-bit integer.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from art_proxy.config import ProxySettings
from art_proxy.config.proxy import is_loopback
from art_proxy.dashboard import is_dashboard_path
from art_proxy.errors import BadRequest, Forbidden

_CHANGES_STATE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def admin_guard(settings: ProxySettings) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        admin = path.startswith("/art/")
        if not admin and not is_dashboard_path(path):
            return await handler(request)
        # A key is a header no page can send cross-origin without a preflight: with one, the
        # key decides (`_auth`).
        if settings.admin_key is None:
            if not settings.open_admin and not is_loopback(request.remote or ""):
                # Closed by default: a keyless admin API reads every user's words, erases
                # them and moves the alias every agent calls.
                raise Forbidden(
                    "the admin API and the dashboard answer only clients on this machine "
                    "without an admin key: set --admin-key (ART_PROXY_ADMIN_KEY) and send it as "
                    "Bearer, or --open-admin to serve them to anyone who can reach the port"
                )
            if not host_served(request.host, settings):
                raise Forbidden(
                    f"Host {request.host!r} is not a name this proxy serves (a page on another "
                    "site can rebind its name to this address): call it by a loopback name, "
                    "or add the name to --allowed-hosts",
                )
            if admin and request.method in _CHANGES_STATE:
                same_origin_json(request)
        no_nul(request)
        return await handler(request)

    return guard


def host_served(host: str, settings: ProxySettings) -> bool:
    """Whether `host` (the Host header, port and all) names this proxy: a loopback name, the
    bound address or one of `--allowed-hosts`. A keyless admin API answers only clients on this
    machine, where a browser is the other party; only `--open-admin` beyond loopback without
    `--allowed-hosts` serves whatever name its network gives it."""
    if settings.open_admin and not settings.allowed_hosts and not is_loopback(settings.host):
        return True
    if "*" in settings.allowed_hosts:
        return True
    name = urlsplit(f"//{host}").hostname or ""
    return name in settings.allowed_hosts or name == settings.host or is_loopback(name)


def same_origin_json(request: web.Request) -> None:
    """A state-changing admin request: JSON (or no body), from this origin when one is named."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise Forbidden(f"cross-origin request from {origin!r} refused", param="Origin")
    if request.can_read_body and request.content_type != "application/json":
        raise BadRequest(
            f"Content-Type {request.content_type!r}: admin requests send JSON (application/json)",
            param="Content-Type",
        )


def no_nul(request: web.Request) -> None:
    for name, value in (*request.match_info.items(), *request.query.items()):
        if "\x00" in value:
            raise BadRequest(f"{name} holds a NUL character", param=name)
