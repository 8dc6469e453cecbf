"""The API's sockets against slow and greedy clients.

Theory of operation
-------------------
Every tenant's status, progress and submissions go through one API process,
whose connections are file descriptors of one process. Before a request is
parsed there is no tenant to rate-limit, so a client that opens connections
and sends nothing, or a request head one byte at a time (slowloris), or a
body slower than that, would hold descriptors and handlers until the process
could accept no one: every tenant stalled by one client. Three bounds, all
per connection and set in ``ApiConfig``:

1. **Idle connections close.** A connection that has not delivered a
   complete request head within ``idle_timeout_s`` of its opening, or of its
   last response, is closed (aiohttp's keep-alive timer, which runs from the
   connection's start and closes a connection waiting for a request, partial
   head or none). A request in progress, an event stream included, is not
   idle.
2. **A body has a deadline.** ``submit_job`` reads its body within
   ``body_timeout_s`` or answers 408 ``body_timeout`` (``producers.api``).
3. **Connections per peer address are capped.** :class:`PeerGate` counts the
   open connections of each remote address; one past
   ``max_connections_per_peer`` is answered at once with a 429 naming the
   limit and closed, before any byte of it is read, so one address cannot
   take the descriptors every other client needs. Behind a proxy that owns
   the clients' connections, every client shares the proxy's address: set
   the cap to 0 (none) there, and cap at the proxy.

Cost: one dict update at a connection's start and end; the per-chunk path
is one extra Python call (the gate forwards to aiohttp's protocol).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from framespool.producers.api import CONFIG, METRICS

log = logging.getLogger(__name__)


def refusal(cap: int) -> bytes:
    """The whole HTTP answer to a connection past its address's cap."""
    message = (
        f"this address already holds {cap} open connections to the API "
        "(max_connections_per_peer); reuse or close them"
    )
    body = json.dumps({"error": {"code": "too_many_connections", "message": message}}).encode()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class PeerGate:
    """Open connections per remote address, and the refusals past ``cap`` (0: none)."""

    def __init__(self, cap: int, on_refuse: Callable[[], None] | None = None) -> None:
        if cap < 0:
            raise ValueError(f"max_connections_per_peer={cap} must be 0 (no cap) or more")
        self.cap = cap
        self.open: dict[str, int] = {}
        self.refused = 0
        self._on_refuse = on_refuse

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """Wrap aiohttp's protocol factory (``runner.server``) with this gate."""
        return lambda: _Gated(self, inner)

    def admit(self, address: str) -> bool:
        """Count one more connection of ``address``, or refuse it (False) past the cap."""
        held = self.open.get(address, 0)
        if self.cap and held >= self.cap:
            self.refused += 1
            if self._on_refuse is not None:
                self._on_refuse()
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "connection refused: %s holds %d connections (max_connections_per_peer); "
                    "%d refused so far",
                    address,
                    held,
                    self.refused,
                )
            return False
        self.open[address] = held + 1
        return True

    def leave(self, address: str) -> None:
        """One admitted connection of ``address`` ended."""
        left = self.open[address] - 1
        if left:
            self.open[address] = left
        else:
            del self.open[address]


class _Gated(asyncio.Protocol):
    """One connection: admitted by its address's count, else answered 429 and
    closed; an admitted one forwards everything to the aiohttp protocol made
    for it."""

    def __init__(self, gate: PeerGate, factory: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self._peer: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        if not self._gate.admit(address):
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(refusal(self._gate.cap))
            transport.close()
            return
        self._peer = address
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is not None:
            self._gate.leave(self._peer)
            self._peer = None
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GatedSite(web.BaseSite):
    """A TCP site whose connections pass a :class:`PeerGate` first."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, gate: PeerGate) -> None:
        super().__init__(runner)
        self._host, self._port, self.gate = host, port, gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the requested one before start; 0 picks a free one)."""
        if self._server is not None and self._server.sockets:  # type: ignore[attr-defined]
            return int(self._server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        return self._port

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.gate.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, GatedSite]:
    """Start ``app`` on ``host:port`` with the edge bounds of its ``ApiConfig``;
    the caller cleans the runner up."""
    config = app[CONFIG]
    runner = web.AppRunner(app, keepalive_timeout=config.idle_timeout_s)
    await runner.setup()
    gate = PeerGate(config.max_connections_per_peer, app[METRICS].connections_refused.inc)
    site = GatedSite(runner, host, port, gate)
    await site.start()
    return runner, site
