"""A TCP relay on loopback that fails on command: an outage of the server behind it, on cue.

Put in front of PostgreSQL it makes the outages a production store has (a restart, a failover, a
network cut) without touching the server: `drop()` cuts every connection and closes each new one
as soon as it is accepted; `refuse()` stops listening, so connecting fails; `stall()` keeps every
connection open but moves no byte either way (a partition: nothing fails, nothing answers);
`restore()` relays again on the same port, stalled bytes included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from enum import Enum


class Mode(Enum):
    relay = "relay"
    drop = "drop"
    refuse = "refuse"


class FaultyTcp:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._port = 0
        self._connections: set[asyncio.Task[None]] = set()
        self.mode = Mode.relay
        self.accepted = 0
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self._port, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]

    async def drop(self) -> None:
        """Cut every open connection; accept new ones only to close them."""
        self.mode = Mode.drop
        await self._cut_all()

    async def stall(self) -> None:
        """Hold every byte, on open connections and new ones, until `restore()`."""
        self._flowing.clear()

    async def refuse(self) -> None:
        """Cut every open connection and stop listening: connecting is refused."""
        self.mode = Mode.refuse
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self._cut_all()

    async def restore(self) -> None:
        if self._server is None:
            await self.start()
        self.mode = Mode.relay
        self._flowing.set()

    async def aclose(self) -> None:
        await self.refuse()

    async def _cut_all(self) -> None:
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode is not Mode.relay:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            self._connections.discard(task)
            return
        try:
            await asyncio.gather(
                _pipe(reader, upstream_writer, self._flowing),
                _pipe(upstream_reader, writer, self._flowing),
            )
        except asyncio.CancelledError:
            pass
        finally:
            for side in (writer, upstream_writer):
                side.transport.abort()  # a cut, not a polite close
            self._connections.discard(task)


async def _pipe(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, flowing: asyncio.Event
) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            await flowing.wait()
            sink.write(data)
            await sink.drain()
    with contextlib.suppress(OSError, RuntimeError):
        sink.write_eof()


@asynccontextmanager
async def faulty_tcp(target_host: str, target_port: int) -> AsyncIterator[FaultyTcp]:
    relay = FaultyTcp(target_host, target_port)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.aclose()
