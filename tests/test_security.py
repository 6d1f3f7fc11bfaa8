"""Keys guard the proxy, never leak, and bad command lines fail in one line.

Client calls need `api_key` when it is set, `/art/` needs `admin_key` (the API key is not enough),
`/health` stays open for load balancers. No key or Authorization header ever reaches the store or the
logs, and the upstream gets the upstream key, not the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import socket
import sqlite3
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
import pytest
import pytest_socket
from aiohttp import web

from art_proxy.config import ProxySettings
from art_proxy.proxy.server import RunningProxy, running_proxy, warn_if_exposed
from art_proxy.testing.fake_vllm import FakeVllm, create_fake_vllm_app
from art_proxy.testing.loopback import serving
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there"}]}
API_KEY = "sk-proxy-api-7f3a9c1e5b"
ADMIN_KEY = "sk-proxy-admin-2d8e4b6a0c"
UPSTREAM_KEY = "sk-upstream-9b1d3f5a7e"
WRONG_KEY = "sk-wrong-key-4c6e8a0b2d"
SECRETS = (API_KEY, ADMIN_KEY, UPSTREAM_KEY, WRONG_KEY)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def keyed_proxy(sqlite_url: str, vllm: FakeVllm) -> AsyncIterator[RunningProxy]:
    settings = proxy_settings(sqlite_url, vllm.base_url, api_key=API_KEY, admin_key=ADMIN_KEY)
    async with running_proxy(settings) as running:
        yield running


async def request(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[int, bytes]:
    data = orjson.dumps(body) if body is not None else None
    async with http.request(method, url, data=data, headers=headers) as response:
        return response.status, await response.read()


def assert_unauthorized(status: int, raw: bytes) -> None:
    assert status == 401, raw
    error = orjson.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 401
    assert error["type"] == "AuthenticationError"
    assert "Bearer" in error["message"]


# --- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer(WRONG_KEY),
        {"Authorization": API_KEY},  # no scheme
        {"Authorization": f"Basic {API_KEY}"},
        bearer(API_KEY + "x"),
        bearer(ADMIN_KEY),  # the admin key is not a client key
    ],
    ids=["none", "wrong", "no-scheme", "basic", "longer", "admin-key"],
)
async def test_client_call_without_the_api_key_is_401_and_nothing_is_recorded(
    keyed_proxy: RunningProxy,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    headers: dict[str, str],
) -> None:
    url = keyed_proxy.base_url + "/chat/completions"
    assert_unauthorized(*await request(http, "POST", url, headers, CHAT))
    assert_unauthorized(*await request(http, "GET", keyed_proxy.base_url + "/models", headers))
    assert vllm.requests == []
    await keyed_proxy.parts.settled()
    assert await keyed_proxy.parts.store.trajectories() == []


async def test_client_call_with_the_api_key_as_bearer_is_200(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    url = keyed_proxy.base_url + "/chat/completions"
    status, _ = await request(http, "POST", url, bearer(API_KEY), CHAT)
    assert status == 200
    status, _ = await request(
        http, "POST", url, {"Authorization": f"bearer  {API_KEY} "}, CHAT
    )  # scheme case and spacing are not the client's problem
    assert status == 200
    status, _ = await request(http, "GET", keyed_proxy.base_url + "/models", bearer(API_KEY))
    assert status == 200
    await keyed_proxy.parts.settled()
    assert len(await keyed_proxy.parts.store.trajectories()) >= 1


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/art/v1/trajectories"),
        ("GET", "/art/v1/trajectories/some-id"),
        ("POST", "/art/v1/trajectories/some-id/finish"),
        ("GET", "/art/v1/groups"),
        ("GET", "/art/v1/scenarios"),
    ],
)
async def test_art_endpoints_need_the_admin_key_and_the_api_key_is_not_enough(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession, method: str, path: str
) -> None:
    url = keyed_proxy.root_url + path
    for headers in ({}, bearer(API_KEY), bearer(WRONG_KEY)):
        assert_unauthorized(*await request(http, method, url, headers))
    status, _ = await request(http, method, url, bearer(ADMIN_KEY))
    assert status in (200, 404)  # 404: the trajectory "some-id" does not exist


async def test_health_is_open_when_keys_are_set(
    keyed_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    status, raw = await request(http, "GET", keyed_proxy.root_url + "/health")
    assert status == 200
    assert orjson.loads(raw)["status"] == "ok"


def exposed_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and record.name == "art_proxy.proxy.server"
    ]


async def test_binding_beyond_loopback_without_keys_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    warn_if_exposed(ProxySettings(host="0.0.0.0"))
    [warning] = exposed_warnings(caplog)
    assert "0.0.0.0" in warning and "--api-key" in warning and "--admin-key" in warning


async def test_binding_beyond_loopback_with_only_the_api_key_is_refused_unless_open_admin() -> None:
    """The API key guards the calls but not /art/, where anyone could move a model alias."""
    with pytest.raises(ValueError, match=r"--admin-key.*--open-admin"):
        ProxySettings(host="0.0.0.0", api_key=API_KEY)
    ProxySettings(host="0.0.0.0", api_key=API_KEY, open_admin=True)
    ProxySettings(host="127.0.0.1", api_key=API_KEY)  # loopback: a warning, below


async def test_cli_refuses_the_api_key_alone_beyond_loopback_in_one_line_without_the_key() -> None:
    returncode, stdout, stderr = await run_cli("serve", "--host", "0.0.0.0", "--api-key", API_KEY)
    assert returncode != 0 and stdout == ""
    line = the_error_line(stderr)
    assert "--admin-key" in line and "--open-admin" in line
    assert API_KEY not in stderr


async def test_only_the_api_key_warns_that_art_is_open_without_the_key_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    warn_if_exposed(ProxySettings(host="127.0.0.1", api_key=API_KEY))
    [warning] = exposed_warnings(caplog)
    assert "/art/" in warning and "--admin-key" in warning
    caplog.clear()
    warn_if_exposed(ProxySettings(host="0.0.0.0", api_key=API_KEY, open_admin=True))
    open_art, exposed = exposed_warnings(caplog)
    assert "/art/" in open_art
    assert "0.0.0.0" in exposed and "--admin-key" in exposed and "--api-key" not in exposed
    assert API_KEY not in caplog.text


@pytest.mark.parametrize(
    "settings",
    [
        ProxySettings(host="127.0.0.1"),
        ProxySettings(host="localhost"),
        ProxySettings(host="::1"),
        ProxySettings(host="0.0.0.0", api_key=API_KEY, admin_key=ADMIN_KEY),
    ],
    ids=["ipv4-loopback", "localhost", "ipv6-loopback", "exposed-with-keys"],
)
async def test_no_warning_on_loopback_or_with_both_keys(
    caplog: pytest.LogCaptureFixture, settings: ProxySettings
) -> None:
    caplog.set_level(logging.WARNING)
    warn_if_exposed(settings)
    assert exposed_warnings(caplog) == []


# --- secrets never leak --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fake_vllm_seeing_authorization() -> AsyncIterator[tuple[str, list[str | None]]]:
    """The fake vLLM, plus the Authorization header of every request it answered."""
    seen: list[str | None] = []
    app = create_fake_vllm_app()

    async def note(request: web.Request, _response: web.StreamResponse) -> None:
        seen.append(request.headers.get("Authorization"))

    app.on_response_prepare.append(note)
    async with serving(app) as root_url:
        yield f"{root_url}/v1", seen


@contextlib.asynccontextmanager
async def fake_vllm_setting_cookies() -> AsyncIterator[tuple[str, list[str | None]]]:
    """The fake vLLM setting a cookie on every answer, as a hosted API behind a CDN does
    (Cloudflare's `__cf_bm`), plus the Cookie header of every request it answered."""
    seen: list[str | None] = []
    app = create_fake_vllm_app()

    async def set_cookie(request: web.Request, response: web.StreamResponse) -> None:
        seen.append(request.headers.get("Cookie"))
        response.headers.add("Set-Cookie", f"__cf_bm=agent-{len(seen)}-session; Path=/")

    app.on_response_prepare.append(set_cookie)
    async with serving(app) as root_url:
        # By name: aiohttp's cookie jar drops cookies from a bare IP address on its own.
        yield f"{root_url.replace('127.0.0.1', 'localhost')}/v1", seen


def dump_sqlite(path: str) -> str:
    """Every row of every table, as text."""
    lines: list[str] = []
    with contextlib.closing(sqlite3.connect(path)) as connection:
        tables = [
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            for row in connection.execute(f'SELECT * FROM "{table}"'):
                lines.append(f"{table}: {row!r}")
    return "\n".join(lines)


async def exercise_every_endpoint(proxy: RunningProxy, http: aiohttp.ClientSession) -> None:
    """Calls of every kind (ok, streamed, upstream error, rejected) plus the admin API."""
    client = bearer(API_KEY)
    trajectory = {**client, "X-Art-Trajectory": "run-1"}
    chat_url = proxy.base_url + "/chat/completions"
    answers = [
        await request(http, "POST", chat_url, trajectory, CHAT),
        await request(http, "POST", chat_url, trajectory, {**CHAT, "stream": True}),
        await request(
            http, "POST", proxy.base_url + "/completions", client, {"model": MODEL, "prompt": "Hi"}
        ),
        await request(http, "GET", proxy.base_url + "/models", client),
        await request(http, "GET", proxy.root_url + "/art/v1/trajectories", bearer(ADMIN_KEY)),
        await request(
            http,
            "POST",
            proxy.root_url + "/art/v1/trajectories/run-1/finish",
            bearer(ADMIN_KEY),
            {"reward": 1.0},
        ),
    ]
    assert [status for status, _ in answers] == [200] * len(answers)
    status, _ = await request(http, "POST", chat_url, client, {**CHAT, "model": "no-such-model"})
    assert status == 404
    status, _ = await request(http, "POST", chat_url, bearer(WRONG_KEY), CHAT)
    assert status == 401
    status, _ = await request(http, "GET", proxy.root_url + "/art/v1/groups", client)
    assert status == 401


async def test_keys_and_authorization_headers_never_reach_the_store_or_the_logs(
    sqlite_url: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with fake_vllm_seeing_authorization() as (upstream, _seen):
        settings = proxy_settings(
            sqlite_url,
            upstream,
            api_key=API_KEY,
            admin_key=ADMIN_KEY,
            upstream_api_key=UPSTREAM_KEY,
        )
        async with running_proxy(settings) as proxy:
            await exercise_every_endpoint(proxy, http)
            assert proxy.parts.counters.calls == 4

    stored = dump_sqlite(sqlite_url.removeprefix("sqlite:///"))
    assert "Hello from the fake." in stored and "no-such-model" in stored  # the dump has the calls
    logged = caplog.text + "\n".join(repr(record.__dict__) for record in caplog.records)
    assert caplog.records, "nothing was logged: the log check would prove nothing"
    for secret in SECRETS:
        assert secret not in stored, f"{secret} is in the store"
        assert secret not in logged, f"{secret} is in the logs"
    assert "Authorization" not in stored and "Bearer" not in stored


async def test_upstream_gets_the_upstream_key_not_the_client_key(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    async with fake_vllm_seeing_authorization() as (upstream, seen):
        settings = proxy_settings(
            sqlite_url, upstream, api_key=API_KEY, upstream_api_key=UPSTREAM_KEY
        )
        async with running_proxy(settings) as proxy:
            client = bearer(API_KEY)
            chat_url = proxy.base_url + "/chat/completions"
            for body in (CHAT, {**CHAT, "stream": True}):
                status, _ = await request(http, "POST", chat_url, client, body)
                assert status == 200
            status, _ = await request(http, "GET", proxy.base_url + "/models", client)
            assert status == 200
    # The proxy's own start-up look at /models, then the agent's three calls.
    assert seen == [f"Bearer {UPSTREAM_KEY}"] * 4


async def test_without_an_upstream_key_the_client_authorization_is_passed_on(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """An open proxy in front of a hosted API: the agent's own key is the upstream's key."""
    async with fake_vllm_seeing_authorization() as (upstream, seen):
        settings = proxy_settings(sqlite_url, upstream)
        async with running_proxy(settings) as proxy:
            chat_url = proxy.base_url + "/chat/completions"
            status, _ = await request(http, "POST", chat_url, bearer("sk-agent-own"), CHAT)
            assert status == 200
            status, _ = await request(http, "POST", chat_url, {}, CHAT)
            assert status == 200
    # The start-up look at /models carries no client's key (there is none to carry).
    assert seen == [None, "Bearer sk-agent-own", None]


async def test_the_proxy_api_key_is_not_passed_on_to_the_upstream(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """Behind `--api-key` the client's Authorization is the proxy's key, not the upstream's."""
    async with fake_vllm_seeing_authorization() as (upstream, seen):
        settings = proxy_settings(sqlite_url, upstream, api_key=API_KEY)
        async with running_proxy(settings) as proxy:
            client = bearer(API_KEY)
            status, _ = await request(
                http, "POST", proxy.base_url + "/chat/completions", client, CHAT
            )
            assert status == 200
            status, _ = await request(http, "GET", proxy.base_url + "/models", client)
            assert status == 200
    assert seen == [None, None, None]  # the start-up look at /models, then the calls


async def test_cookies_an_upstream_sets_are_not_sent_with_other_agents_calls(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """One pooled session serves every agent behind the proxy: a cookie one answer set must not
    ride along on the next agent's call."""
    async with (
        fake_vllm_setting_cookies() as (upstream, seen),
        running_proxy(proxy_settings(sqlite_url, upstream)) as proxy,
    ):
        for agent_key in ("sk-agent-one-1a2b3c", "sk-agent-two-4d5e6f"):
            status, _ = await request(
                http, "POST", proxy.base_url + "/chat/completions", bearer(agent_key), CHAT
            )
            assert status == 200
    assert seen == [None, None, None]  # the start-up look at /models, then the calls


# --- the command line ------------------------------------------------------------------------


async def run_cli(*args: str) -> tuple[int, str, str]:
    script = Path(sys.executable).parent / "art-proxy"
    command = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from art_proxy.cli import main; main()"]
    )
    process = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def the_error_line(stderr: str) -> str:
    """The one line that says what is wrong (a usage hint may precede it, no traceback)."""
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.mark.parametrize(
    ("args", "flag", "reason"),
    [
        (("serve", "--port", "notanumber"), "--port", "integer"),
        (("serve", "--upstream", "ftp://x"), "--upstream", "ftp://x"),
        (("train", "--judge", "openai/j", "--judge-base-url", "ftp://j"), "judge", "ftp://j"),
        (("judge", "--judge", "openai/j", "--judge-base-url", "ftp://j"), "judge", "ftp://j"),
    ],
    ids=["port", "upstream", "train-judge-base-url", "judge-base-url"],
)
async def test_cli_with_a_bad_flag_exits_nonzero_with_a_one_line_message(
    args: tuple[str, ...], flag: str, reason: str
) -> None:
    returncode, stdout, stderr = await run_cli(*args)
    assert returncode != 0
    line = the_error_line(stderr)
    assert flag in line and reason in line
    assert stdout == ""


async def test_cli_export_from_a_store_in_a_missing_folder_exits_1_with_a_one_line_error() -> None:
    returncode, stdout, stderr = await run_cli(
        "export", "--store", "sqlite:////nonexistent/dir/x.db"
    )
    assert returncode == 1
    assert len(stderr.strip().splitlines()) == 1, stderr
    line = the_error_line(stderr)
    assert "/nonexistent/dir" in line and "does not exist" in line
    assert stdout == ""


async def test_a_web_page_cannot_drive_the_keyless_admin_api(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """What a browser sends for a page on another site: a `text/plain` POST to the erasure route
    (no CORS preflight), a JSON one with its Origin, and, after DNS rebinding, a same-origin read
    naming the page's own host."""
    root = sqlite_proxy.root_url
    async with http.post(f"{root}/v1/chat/completions", json=CHAT) as answered:
        assert answered.status == 200
    await sqlite_proxy.parts.settled()
    forget = f"{root}/art/v1/forget"
    as_text = await http.post(
        forget,
        data=b'{"user": "alice"}',
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    cross_origin = await http.post(
        forget, json={"user": "alice"}, headers={"Origin": "https://evil.example"}
    )
    text_from_here = await http.post(
        forget, data=b'{"user": "alice"}', headers={"Content-Type": "text/plain"}
    )
    rebound = await http.get(f"{root}/art/v1/trajectories", headers={"Host": "evil.example:8100"})
    dashboard = await http.get(f"{root}/dashboard", headers={"Host": "evil.example:8100"})
    same_origin = await http.post(forget, json={"user": "alice"}, headers={"Origin": root})
    listed = await http.get(f"{root}/art/v1/trajectories", headers={"Host": "localhost"})

    assert [r.status for r in (as_text, cross_origin, text_from_here)] == [403, 403, 400]
    assert (rebound.status, dashboard.status) == (403, 403)
    assert "evil.example" in (await rebound.json())["error"]["message"]
    assert (same_origin.status, listed.status) == (200, 200)
    assert len((await listed.json())["data"]) == 1  # nothing was erased by the refused ones


async def test_allowed_hosts_name_what_the_admin_api_answers_to(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, allowed_hosts=["art-proxy.internal"])
    async with running_proxy(settings) as proxy:
        named = await http.get(
            f"{proxy.root_url}/art/v1/trajectories", headers={"Host": "art-proxy.internal:8100"}
        )
        other = await http.get(
            f"{proxy.root_url}/art/v1/trajectories", headers={"Host": "evil.example"}
        )
        agents = await http.post(
            f"{proxy.root_url}/v1/chat/completions", json=CHAT, headers={"Host": "evil.example"}
        )
    assert (named.status, other.status, agents.status) == (200, 403, 200)


def _address_beyond_loopback() -> str:
    """An IPv4 address of this machine's beyond loopback (its interfaces', read by ioctl: no
    packet leaves), let past pytest-socket for this test."""
    siocgifaddr = 0x8915
    for _index, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), siocgifaddr, struct.pack("256s", name.encode())
                )
            except OSError:
                continue  # no IPv4 address on it
        address = socket.inet_ntoa(packed[20:24])
        if not ipaddress.ip_address(address).is_loopback:
            pytest_socket.socket_allow_hosts(
                ["127.0.0.0/8", "::1", address], allow_unix_socket=True
            )
            return address
    pytest.skip("this machine has no address beyond loopback to call the proxy from")


@pytest.mark.parametrize(
    ("keys", "opened"),
    [({}, False), ({"open_admin": True}, True), ({"admin_key": ADMIN_KEY}, True)],
    ids=["no-admin-key", "open-admin", "admin-key"],
)
async def test_without_an_admin_key_the_admin_api_answers_clients_on_this_machine_only(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, keys: dict[str, Any], opened: bool
) -> None:
    """Bound beyond loopback (the image's and the manifests' way), a keyless admin API read a
    user's words and erased her data for any client that could reach the port. Closed by
    default: a client elsewhere gets 403 saying what opens it; the agents' calls are served."""
    address = _address_beyond_loopback()
    settings = proxy_settings(sqlite_url, vllm.base_url, host="0.0.0.0", **keys)
    headers = bearer(ADMIN_KEY) if "admin_key" in keys else {}
    async with running_proxy(settings) as proxy:
        port = urlsplit(proxy.root_url).port
        elsewhere, here_root = f"http://{address}:{port}", f"http://127.0.0.1:{port}"
        called = await http.post(f"{elsewhere}/v1/chat/completions", json=CHAT)
        listed = await http.get(f"{elsewhere}/art/v1/trajectories", headers=headers)
        page = await http.get(f"{elsewhere}/dashboard", headers=headers)
        here = await http.get(f"{here_root}/art/v1/trajectories", headers=headers)
        # A page that rebinds its name to this machine: a loopback peer naming another host.
        rebound = await http.get(
            f"{here_root}/art/v1/trajectories", headers={**headers, "Host": "evil.example"}
        )
    assert (called.status, here.status) == (200, 200)
    if opened:
        assert (listed.status, page.status) == (200, 200)
    else:
        assert (listed.status, page.status, rebound.status) == (403, 403, 403)
        assert "--admin-key" in (await listed.json())["error"]["message"]
