"""Fair workers and an at-once 400 (issue 36, items 3 and 7), on the real sidecar over loopback.

A client sending whole ``GET /metrics`` requests back to back on 1,000 connections (from
127.0.0.2, a distinct client address on Linux) must not keep another client's once-a-second
scrape waiting: the workers take whole requests round-robin by client address. And bytes that
cannot begin an HTTP request line (a TLS ClientHello on the plain port, junk without a line end)
get 400 at once instead of being held to the request deadline (docs/testing.md, "Attacks")."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time

import pytest

from procs import as_this_machine_gives, http_get, sidecar
from spoolmaker import hooked_process
from webhookproc import raise_descriptor_limit, timed

FLOODERS = 1000
SCRAPES = 20
ANSWER_SECONDS = 1.0
FLOOD = r"""
import selectors, socket, sys, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: sidecar\r\n\r\n"
sel = selectors.DefaultSelector()
def connect():
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    sel.register(s, selectors.EVENT_WRITE, [bytearray(), False])
for _ in range(n):
    connect()
sent = answered = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for key, events in sel.select(0.2):
        s, state = key.fileobj, key.data
        if events & selectors.EVENT_WRITE:  # connected, or the last answer was whole: the next request
            try:
                s.sendall(REQUEST)
            except OSError:
                sel.unregister(s); s.close(); connect(); continue
            sent += 1
            sel.modify(s, selectors.EVENT_READ, [bytearray(), False])
            continue
        try:
            data = s.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            sel.unregister(s); s.close(); connect(); continue
        buf = state[0]; buf += data
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            continue
        head = bytes(buf[:head_end]).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
        if len(buf) >= head_end + 4 + length:
            answered += 1
            if b"connection: close" in head:
                sel.unregister(s); s.close(); connect()
            else:
                sel.modify(s, selectors.EVENT_WRITE, [bytearray(), False])
print(sent, answered, flush=True)
"""


@pytest.fixture
def served_spool(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    hooked_process(spool, monkeypatch=monkeypatch)
    return spool


def loopback_alias_works() -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not loopback_alias_works(), reason="127.0.0.2 is not a loopback address here (Linux has it)")
def test_a_scraper_is_answered_within_a_second_while_another_client_floods_whole_requests_on_1000_connections(
    served_spool,
):
    raise_descriptor_limit(FLOODERS + 256)
    with sidecar(served_spool) as (_proc, port):
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(port), str(FLOODERS), str(SCRAPES + 8)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(3.0)  # every flooding connection has its request in
            scrapes = []
            for _ in range(SCRAPES):
                started = time.monotonic()
                scrapes.append(timed(lambda: http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)[0]))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        finally:
            sent, answered = map(int, flood.communicate(timeout=60)[0].split())
    seconds = sorted(s for s, _ in scrapes)
    print(f"scrapes under the flood: median {seconds[len(seconds) // 2]:.3f} s, slowest {seconds[-1]:.3f} s; "
          f"flood: {sent} requests sent, {answered} answered")  # fmt: skip
    assert answered > 10 * SCRAPES, "the flood did not keep the workers busy"
    assert [r for _, r in scrapes] == [200] * SCRAPES
    assert sum(s < as_this_machine_gives(ANSWER_SECONDS) for s in seconds) >= SCRAPES - 1, seconds


def client_hello() -> bytes:
    """The first bytes a TLS client sends: a real ClientHello, from Python's own TLS."""
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="x")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("sent", [client_hello(), b"\x00\x01junk without a line end", b"hello there friend"])
def test_bytes_that_cannot_begin_a_request_line_get_400_at_once_on_the_plain_port(served_spool, sent):
    with sidecar(served_spool) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(sent)
            reply = sock.recv(100)
            took = time.monotonic() - start
        assert reply.startswith(b"HTTP/1.1 400"), reply
        assert took < as_this_machine_gives(ANSWER_SECONDS), f"{took:.2f} s"
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200


def test_whole_requests_are_taken_round_robin_by_client_address():
    from oomsight_server.connection import Connection, ConnectionTable

    table = ConnectionTable()
    flood = [Connection(object(), ("127.0.0.2", 1000 + i), 0.0, 30.0) for i in range(1000)]
    scraper = Connection(object(), ("127.0.0.1", 50000), 0.0, 30.0)
    for conn in [*flood, scraper]:
        table.hold(conn)
        table.dispatch(conn)
    taken = [table.next_ready() for _ in range(3)]
    assert taken == [flood[0], scraper, flood[1]]  # the scraper waits for one flooding request, not 1,000
    assert table.next_ready() is flood[2] and len(table.busy) == 1001
