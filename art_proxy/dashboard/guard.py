"""Who may see the dashboard, and what a browser may run on it.

With an admin key set, a request passes with `Authorization: Bearer KEY` or the session cookie.
A browser cannot send a header on navigation, so `?key=KEY` once sets that cookie (HttpOnly,
SameSite=Strict) and redirects to the same URL without the key, which then stays out of the address
bar and the history. The cookie holds an HMAC of the key, not the key: it opens the dashboard only,
and changing the key revokes it. The key is never rendered into a page or logged.

Every dashboard response carries a Content-Security-Policy that allows only the dashboard's own
script and styles, so even an escape that was missed would run nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler

PREFIX = "/dashboard"
COOKIE = "art_dashboard"
KEY_PARAM = "key"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

BearerCheck = Callable[[web.Request, str], bool]


def is_dashboard_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def session_token(admin_key: str) -> str:
    return hmac.new(admin_key.encode(), b"art-proxy dashboard session", hashlib.sha256).hexdigest()


async def guard_dashboard(
    request: web.Request, handler: Handler, admin_key: str | None, bearer_matches: BearerCheck
) -> web.StreamResponse:
    """The auth middleware's rule for dashboard paths; `bearer_matches` is the proxy's check."""
    response = await _admit(request, handler, admin_key, bearer_matches)
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


async def _admit(
    request: web.Request, handler: Handler, admin_key: str | None, bearer_matches: BearerCheck
) -> web.StreamResponse:
    if not admin_key:
        return await handler(request)
    token = session_token(admin_key)
    if KEY_PARAM in request.query:  # before the header: the key must leave the address either way
        if not _same(request.query[KEY_PARAM], admin_key):
            return unauthorized()
        # 303: whatever the method, the browser comes back with a GET for the clean URL.
        location = request.rel_url.with_query(
            [(name, value) for name, value in request.query.items() if name != KEY_PARAM]
        )
        redirect = web.Response(status=303, headers={"Location": str(location)})
        redirect.set_cookie(
            COOKIE, token, path=PREFIX, httponly=True, samesite="Strict", secure=request.secure
        )
        return redirect
    if bearer_matches(request, admin_key) or _same(request.cookies.get(COOKIE, ""), token):
        return await handler(request)
    return unauthorized()


def unauthorized() -> web.Response:
    return web.Response(status=401, text=_UNAUTHORIZED_PAGE, content_type="text/html")


def _same(presented: str, expected: str) -> bool:
    return hmac.compare_digest(presented.encode(), expected.encode())


# Static on purpose: nothing from the request (which may hold a wrong key) is echoed back.
_UNAUTHORIZED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>art-proxy dashboard: key needed</title></head>
<body><main><h1>The dashboard needs the admin key</h1>
<p>This proxy was started with <code>--admin-key</code>. Open
<code>/dashboard?key=YOUR_ADMIN_KEY</code> once: the key is swapped for a session cookie and
removed from the address. Scripts can send <code>Authorization: Bearer YOUR_ADMIN_KEY</code>.</p>
</main></body></html>
"""
