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
   ``body_timeout_s`` or answers 408 ``body_timeout`` (``producers.job_routes``).
3. **Connections per peer are capped.** :class:`PeerGate` counts the open
   connections of each peer, an IPv4 address or an IPv6 /64 (one host
   commonly holds a whole /64: per exact address it would be no cap at all;
   the same key as the unauthenticated rate limit, ``producers.http.source_of``);
   one past ``max_connections_per_peer`` is answered at once with a 429
   naming the limit and closed, before any byte of it is read, so one peer
   cannot take the descriptors every other client needs. Behind a proxy that
   owns the clients' connections, every client shares the proxy's address:
   set the cap to 0 (none) there, and cap at the proxy.
4. **Connections in all are capped.** Past ``max_connections`` open at once
   (many peers together: a botnet, or a /64 per connection), a new one is
   answered 503 and closed the same way, so the process keeps descriptors
   for the connections it has (0: no cap).
5. **A slow reader does not hold its connection.** When a connection's
   send buffer is full (the client does not read: aiohttp's transport pauses
   writing) for ``write_timeout_s``, the connection is aborted, freeing its
   handler and the memory its unsent responses or events hold. An event
   stream resumes with ``Last-Event-ID``.

Cost: one dict update at a connection's start and end; the per-chunk path
is one extra Python call (the gate forwards to aiohttp's protocol); a timer
while a connection's writes are paused.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from framespool.producers.http import CONFIG, METRICS, source_of

log = logging.getLogger(__name__)


def refusal(cap: int, peer: str = "") -> bytes:
    """The whole HTTP answer to a connection past its peer's cap."""
    who = f"this network ({peer})" if "/" in peer else "this address"
    message = (
        f"{who} already holds {cap} open connections to the API "
        "(max_connections_per_peer); reuse or close them"
    )
    return _answer(429, "Too Many Requests", "too_many_connections", message)


def busy(cap: int) -> bytes:
    """The whole HTTP answer to a connection past the process's cap."""
    message = (
        f"the API holds {cap} open connections, its limit (max_connections); "
        "retry shortly, reusing one connection"
    )
    return _answer(503, "Service Unavailable", "too_many_connections", message)


def _answer(status: int, phrase: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class PeerGate:
    """Open connections per peer (``source_of``: IPv4 address, IPv6 /64) and in
    all, and the refusals past ``cap`` per peer or ``total_cap`` in all (0: none)."""

    def __init__(
        self,
        cap: int,
        on_refuse: Callable[[], None] | None = None,
        *,
        total_cap: int = 0,
        write_timeout_s: float = 0.0,
    ) -> None:
        if cap < 0:
            raise ValueError(f"max_connections_per_peer={cap} must be 0 (no cap) or more")
        if total_cap < 0:
            raise ValueError(f"max_connections={total_cap} must be 0 (no cap) or more")
        self.cap = cap
        self.total_cap = total_cap
        self.write_timeout_s = write_timeout_s
        self.open: dict[str, int] = {}
        self.total = 0
        self.refused = 0
        self.slow_readers = 0  # connections aborted for not reading (write_timeout_s)
        self.answer = b""  # the answer to the connection ``admit`` refused last
        self._on_refuse = on_refuse

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """Wrap aiohttp's protocol factory (``runner.server``) with this gate."""
        return lambda: _Gated(self, inner)

    def admit(self, peer: str) -> bool:
        """Count one more connection of ``peer``, or refuse it (False) past the
        peer's cap or the total one; ``answer`` is then what to send it."""
        held = self.open.get(peer, 0)
        if self.cap and held >= self.cap:
            self.answer = refusal(self.cap, peer)
        elif self.total_cap and self.total >= self.total_cap:
            self.answer = busy(self.total_cap)
        else:
            self.open[peer] = held + 1
            self.total += 1
            return True
        self.refused += 1
        if self._on_refuse is not None:
            self._on_refuse()
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning(
                "connection refused: %s holds %d connections, %d open in all "
                "(max_connections_per_peer, max_connections); %d refused so far",
                peer,
                held,
                self.total,
                self.refused,
            )
        return False

    def leave(self, peer: str) -> None:
        """One admitted connection of ``peer`` ended."""
        self.total -= 1
        left = self.open[peer] - 1
        if left:
            self.open[peer] = left
        else:
            del self.open[peer]


class _Gated(asyncio.Protocol):
    """One connection: admitted by its peer's count and the total, else answered
    and closed; an admitted one forwards everything to the aiohttp protocol made
    for it, and is aborted if its writes stay paused ``write_timeout_s``."""

    def __init__(self, gate: PeerGate, factory: Callable[[], asyncio.Protocol]) -> None:
        self._gate = gate
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self._peer: str | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._stalled: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        key = source_of(str(peer[0])) if peer else ""
        if not self._gate.admit(key):
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(self._gate.answer)
            transport.close()
            return
        self._peer = key
        self._transport = transport
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
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
        timeout = self._gate.write_timeout_s
        if timeout > 0 and self._stalled is None and self._transport is not None:
            self._stalled = asyncio.get_running_loop().call_later(timeout, self._abort_stalled)
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if self._inner is not None:
            self._inner.resume_writing()

    def _abort_stalled(self) -> None:
        """The client has not read for ``write_timeout_s``: drop the connection."""
        self._stalled = None
        self._gate.slow_readers += 1
        log.info(
            "connection from %s aborted: it read nothing for %.0f s (write_timeout_s)",
            self._peer,
            self._gate.write_timeout_s,
        )
        if self._transport is not None:
            self._transport.abort()  # type: ignore[attr-defined]


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
    gate = PeerGate(
        config.max_connections_per_peer,
        app[METRICS].connections_refused.inc,
        total_cap=config.max_connections,
        write_timeout_s=config.write_timeout_s,
    )
    site = GatedSite(runner, host, port, gate)
    await site.start()
    return runner, site
