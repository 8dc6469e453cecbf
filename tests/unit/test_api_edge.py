"""The API's sockets against slow and greedy clients (``framespool.producers.edge``):
one client must not hold the descriptors or handlers every other tenant needs."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from framespool.log.memory import MemoryProducer
from framespool.producers.api import ApiConfig, make_app
from framespool.producers.auth import ApiKeys, record_for
from framespool.producers.edge import serve
from framespool.projections.hub import Hub
from framespool.projections.store import InMemoryViewStore

KEY = "acme-key.secret"
AUTH = {"Authorization": f"Bearer {KEY}"}


def config(**edge) -> ApiConfig:
    return ApiConfig(
        auth=ApiKeys([record_for(KEY, "acme", "alice")]),
        store=InMemoryViewStore(),
        producer=MemoryProducer(),
        hub=Hub(),
        dashboard_dir=None,
        sse_keepalive_s=0.2,
        **edge,
    )


async def started(cfg: ApiConfig):
    runner, site = await serve(make_app(cfg), "127.0.0.1", 0)
    return runner, site, site.port


async def connect(port: int, source: str = "127.0.0.1"):
    """A raw connection from ``source`` (any 127/8 address is this host's loopback)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before closing; raises TimeoutError if it stays open."""
    return await asyncio.wait_for(reader.read(), seconds)


@pytest.mark.slow
def test_silent_and_half_sent_connections_are_closed_but_a_long_stream_is_not():
    async def main():
        runner, _site, port = await started(config(idle_timeout_s=0.5))
        try:
            _r1, w1 = await connect(port)  # connects, sends nothing
            r1 = _r1
            r2, w2 = await connect(port)  # a request head, never finished
            w2.write(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")
            await w2.drain()
            async with aiohttp.ClientSession(headers=AUTH) as http:
                sub = await http.post(
                    f"http://127.0.0.1:{port}/v1/jobs", json={"prompt": "a fox", "model": "demo"}
                )
                assert sub.status == 202, await sub.text()
                job = (await sub.json())["job_id"]
                # a stream open 4x the idle timeout is a request in progress, not idle
                async with http.get(f"http://127.0.0.1:{port}/v1/jobs/{job}/events") as stream:
                    assert stream.status == 200
                    seen = b""
                    loop = asyncio.get_running_loop()
                    until = loop.time() + 2.0
                    while loop.time() < until:
                        seen += await asyncio.wait_for(stream.content.readany(), 1.0)
                    assert seen.count(b":") >= 5, seen  # keep-alive comments kept coming
            # both idle connections were closed meanwhile (by 0.5 s; 3 s of slack)
            assert await closed_within(r1, 3.0) == b""
            assert await closed_within(r2, 3.0) == b""
            for w in (w1, w2):
                w.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_one_address_past_its_connection_cap_is_refused_and_others_are_served():
    cap = 8

    async def main():
        runner, site, port = await started(config(max_connections_per_peer=cap))
        try:
            held = [await connect(port, "127.0.0.2") for _ in range(cap)]
            extra = [await connect(port, "127.0.0.2") for _ in range(20)]
            for reader, _w in extra:
                answer = await closed_within(reader, 3.0)
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 429"), answer
                err = json.loads(body)["error"]
                assert err["code"] == "too_many_connections"
                assert f"{cap} open connections" in err["message"]
                assert "max_connections_per_peer" in err["message"]
            assert site.gate.refused == 20 and site.gate.open == {"127.0.0.2": cap}
            # another address is served as if nothing happened
            async with aiohttp.ClientSession(headers=AUTH) as http:
                for _ in range(cap + 2):
                    async with http.get(f"http://127.0.0.1:{port}/v1/jobs") as r:
                        assert r.status == 200
            # the cap counts open connections: one closed frees a place
            _r, w = held.pop()
            w.close()
            await w.wait_closed()
            for _ in range(100):
                if site.gate.open.get("127.0.0.2") == cap - 1:
                    break
                await asyncio.sleep(0.02)
            reader, writer = await connect(port, "127.0.0.2")
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await closed_within(reader, 3.0)).startswith(b"HTTP/1.1 200")
            metrics = await _metrics(runner)
            assert "framespool_api_connections_refused_total 20.0" in metrics
            for _r, w in held + extra:
                w.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def _metrics(runner) -> str:
    from prometheus_client import generate_latest

    from framespool.producers.http import METRICS

    return generate_latest(runner.app[METRICS].registry).decode()


@pytest.mark.slow
def test_a_body_that_does_not_arrive_in_time_is_answered_408():
    async def main():
        runner, _site, port = await started(config(body_timeout_s=0.5))
        try:
            reader, writer = await connect(port)
            writer.write(
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {KEY}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
                + b'{"prompt": "a f'
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert head.startswith(b"HTTP/1.1 408"), head
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            err = json.loads(await reader.readexactly(length))["error"]
            assert err["code"] == "body_timeout" and "body_timeout_s" in err["message"]
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_a_negative_connection_cap_is_refused_naming_the_knob():
    """A negative cap would refuse every connection: it is a configuration error."""
    import pytest

    from framespool.producers.edge import PeerGate

    with pytest.raises(ValueError, match="max_connections_per_peer=-1"):
        PeerGate(-1)
    assert PeerGate(0).admit("10.0.0.1") and PeerGate(0).cap == 0  # 0: no cap


# -- issue #33, 7: peers by prefix, a cap in all, slow readers -----------------------


class FakeTransport(asyncio.WriteTransport):
    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer, self.sent, self.closed, self.aborted = peer, b"", False, False

    def get_extra_info(self, name, default=None):
        return (self.peer, 40_000) if name == "peername" else default

    def write(self, data) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.paused = 0

    def pause_writing(self) -> None:
        self.paused += 1


def gated(gate, peer: str):
    from framespool.producers.edge import _Gated

    conn = _Gated(gate, Inner)
    transport = FakeTransport(peer)
    conn.connection_made(transport)
    return conn, transport


def test_an_ipv6_peer_is_capped_by_its_64_not_by_each_address():
    from framespool.producers.edge import PeerGate

    gate = PeerGate(4)
    conns = [gated(gate, f"2001:db8:1:2::{i:x}") for i in range(1, 11)]
    refused = [t for _, t in conns if t.closed]
    assert len(refused) == 6 and gate.open == {"2001:db8:1:2::/64": 4}
    head, _, body = refused[0].sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429")
    assert "2001:db8:1:2::/64" in json.loads(body)["error"]["message"]
    # another /64 is another peer; an IPv4-mapped address is its IPv4 peer
    assert not gated(gate, "2001:db8:1:3::1")[1].closed
    assert not gated(gate, "::ffff:192.0.2.7")[1].closed and "192.0.2.7" in gate.open


def test_connections_in_all_are_capped():
    from framespool.producers.edge import PeerGate

    gate = PeerGate(4, total_cap=10)
    conns = [gated(gate, f"198.51.100.{i}") for i in range(1, 16)]
    refused = [t for _, t in conns if t.closed]
    assert len(refused) == 5 and gate.total == 10
    head, _, body = refused[0].sent.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and "max_connections" in body.decode()
    conns[0][0].connection_lost(None)  # one ends: a place frees
    assert not gated(gate, "198.51.100.99")[1].closed
    # control: no total cap (0), the same 15 peers are all admitted
    free = PeerGate(4, total_cap=0)
    assert not [t for _, t in (gated(free, f"198.51.100.{i}") for i in range(1, 16)) if t.closed]


def test_a_connection_whose_client_reads_nothing_is_aborted_after_the_write_timeout():
    from framespool.producers.edge import PeerGate

    async def main():
        gate = PeerGate(0, write_timeout_s=0.2)
        conn, transport = gated(gate, "192.0.2.1")
        resumed, resumed_t = gated(gate, "192.0.2.2")
        conn.pause_writing()  # the send buffer is full: the client does not read
        resumed.pause_writing()
        await asyncio.sleep(0.1)
        resumed.resume_writing()  # this one reads again in time
        await asyncio.sleep(0.3)
        return transport, resumed_t, gate

    transport, resumed_t, gate = asyncio.run(main())
    assert transport.aborted and not resumed_t.aborted and gate.slow_readers == 1


def test_a_client_that_stops_reading_a_long_response_is_disconnected():
    """End to end: pipelined requests the client never reads fill the socket;
    the server drops the connection after write_timeout_s instead of holding it."""

    async def main():
        runner, site, port = await started(config(write_timeout_s=0.5))
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
            ask = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(ask * 400)
            await writer.drain()
            loop = asyncio.get_running_loop()
            until = loop.time() + 10
            while site.gate.slow_readers == 0 and loop.time() < until:
                await asyncio.sleep(0.05)
            assert site.gate.slow_readers == 1
            assert site.gate.open == {}, "its place is free"
            writer.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())
