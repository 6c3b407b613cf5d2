"""The HTTP listener under every oomsight server (sidecar metrics and admin, webhook): its event loop.

One event-loop thread holds every connection while its request arrives (TLS handshake
included); a few worker threads answer requests that arrived whole, round-robin over client
addresses (a client flooding whole requests delays another by at most one of its own). A connection that
only waits costs a descriptor and its bytes so far, never a thread, so thousands of idle
or slow clients cannot keep Prometheus, the kubelet or the API server from being answered
(docs/kubernetes.md, "Server limits", has the decision and its measurements):

* a **connection cap** (``max_connections``): over it, a waiting connection is closed,
  not the newcomer refused: the idlest (longest without a byte) of the client address that
  holds the most, so a client flooding connections only ever loses its own, and one with
  a few (Prometheus, the kubelet, the API server) keeps them; only when every one holds
  a whole request is a newcomer refused (``503`` on plain HTTP, closed on TLS);
* an **idle timeout** (a connection silent that long is closed) and a **request
  deadline** (a request, TLS handshake, head and body, that takes longer in all to arrive
  is cut off, so a client trickling a byte every few seconds cannot hold anything);
* a **request-head cap**: request line and headers larger than ``max_head_bytes`` get
  ``431`` and a close; a request line that is not ``METHOD target HTTP/x.y`` (HTTP/0.9)
  gets ``400`` and a close, at once, and so do bytes that cannot begin one (a TLS
  ClientHello on a plain port, junk without a line end) before any line end arrives;
* **descriptors**: the soft ``RLIMIT_NOFILE`` is raised toward the hard one to fit the
  caps (:class:`DescriptorBudget`); when ``accept()`` still fails with ``EMFILE`` the
  idlest connection is closed and accepting pauses instead of spinning at 100 % CPU;
* **IPv6**: a listen address with a colon (``::1``, ``::``) gets an ``AF_INET6`` socket.

Who is held and who goes when full is :mod:`oomsight_server.connection`'s table (no sockets);
this module does the I/O it decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import re
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Optional

from oomsight.config.table import Setting, defaults, read_group
from oomsight_server.connection import NEVER, Connection, ConnectionTable

logger = logging.getLogger(__name__)

READ_BYTES = 64 * 1024
LINGER_SECONDS = 2.0
"""How long a closing connection's unread bytes are drained (an answered request's body)."""
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n"
    b"Connection: close\r\nRetry-After: 1\r\n\r\ntoo many connections\r\n"
)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Limits of one HTTP server; read from its component's ``limits`` rows
    (``OOMSIGHT_SIDECAR_MAX_CONNECTIONS`` and friends). The defaults here are the sidecar's
    (``tests/test_config.py`` holds them equal to its rows)."""

    max_connections: int = 1024
    """Connections held open at once; over it, the idlest of the client holding the most is
    closed. A waiting connection costs a descriptor and at most ``max_head_bytes``."""

    workers: int = 4
    """Requests answered at once (one thread each); more wait, whole, for a free worker."""

    idle_timeout_seconds: float = 15.0
    """A connection that sends nothing for this long is closed."""

    request_timeout_seconds: float = 30.0
    """Longest time to receive one request, TLS handshake, head and body (from the
    connection's start, or from the previous answer plus the idle timeout on a kept-alive
    one). Writing the answer is not limited by it (a large artifact download may take
    longer), only by the idle timeout per write."""

    max_head_bytes: int = 8 * 1024
    """Largest request line plus headers; larger requests get 431 and a close."""

    @classmethod
    def from_env(cls, env: Mapping[str, str], rows: tuple[Setting, ...]) -> ServerLimits:
        """The ``limits`` rows of a component's settings table (``oomsight.config.variables.SIDECAR``
        or ``WEBHOOK``): their defaults, and the variables that ``env`` sets."""
        return cls(**{**defaults(rows, "limits"), **read_group(rows, "limits", env)})  # type: ignore[arg-type]


ERROR_REASONS = ("request", "over_capacity", "out_of_descriptors", "deadline")
"""What a server counts: a broken or timed-out connection, one refused over the cap, an
``accept()`` at the descriptor limit, a request cut off at its deadline."""


class ServerErrors:
    """Counts by reason, shared by the servers of one process and exported by its collector."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter(dict.fromkeys(ERROR_REASONS, 0))
        self._lock = threading.Lock()

    def count(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._counts[reason] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class ConnectionReader:
    """A handler's ``rfile``: the bytes the loop already received, then the socket.

    What a request leaves unread (a pipelined next request) stays in ``conn.buffer`` and
    goes back to the loop with the connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _fill(self, most: int = READ_BYTES) -> bool:
        data = self.conn.sock.recv(min(most, READ_BYTES))
        self.conn.buffer += data
        return bool(data)

    def readline(self, limit: int = -1) -> bytes:
        buf = self.conn.buffer
        while True:
            end = buf.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(buf) or not self._fill():
                return self._take(len(buf) if limit < 0 else limit)

    def read(self, size: Optional[int] = -1) -> bytes:
        buf = self.conn.buffer
        if size is None or size < 0:
            while self._fill():
                pass
            return self._take(len(buf))
        while len(buf) < size and self._fill(size - len(buf)):
            pass
        return self._take(size)

    def _take(self, n: int) -> bytes:
        with memoryview(self.conn.buffer) as view:  # one copy, not a slice and then its copy
            out = bytes(view[:n])
        del self.conn.buffer[:n]
        return out

    def close(self) -> None:
        pass  # the connection belongs to the server


class DescriptorBudget:
    """File descriptors the servers of one process may hold: the soft ``RLIMIT_NOFILE``,
    raised toward the hard limit when the servers' caps need it, less a reserve for files."""

    RESERVE = 256
    """Descriptors left for everything else (spool files, the API client, logs)."""

    def __init__(self) -> None:
        self._claimed = 0
        self._lock = threading.Lock()

    def claim(self, wanted: int) -> int:
        """Connections a server may hold, ``wanted`` or fewer (a warning says so)."""
        with self._lock:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            need = self._claimed + wanted + self.RESERVE
            if soft != resource.RLIM_INFINITY and soft < need:
                target = need if hard == resource.RLIM_INFINITY else min(need, hard)
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                    soft = target
            room = wanted if soft == resource.RLIM_INFINITY else soft - self.RESERVE - self._claimed
            granted = max(1, min(wanted, room))
            if granted < wanted:
                logger.warning(
                    "oomsight: a server may hold %d connections, not %d: the descriptor limit is %d "
                    "(raise the container's nofile limit, or lower the connection cap)",
                    granted,
                    wanted,
                    soft,
                )
            self._claimed += granted
            return granted

    def release(self, granted: int) -> None:
        with self._lock:
            self._claimed = max(0, self._claimed - granted)


DESCRIPTORS = DescriptorBudget()
_LISTENER, _WAKE = object(), object()


class BoundedServer:
    """Mixed in before an ``HTTPServer``/``WSGIServer``: an event loop holds every connection
    while its request arrives, ``limits.workers`` threads answer whole requests.

    Call :meth:`init_limits` in ``__init__`` before ``super().__init__`` (set
    ``busy_response`` to None where a plain 503 cannot be sent, on a TLS port); its handler
    calls :meth:`reader` in ``setup`` and :meth:`received` once the request is read, and sets
    ``keep_alive`` for a connection to go back to the loop for its next request. Call
    :meth:`close_limits` after ``server_close()``. ``errors`` counts what was refused or cut
    off (:data:`ERROR_REASONS`)."""

    request_queue_size = 4096  # the listen backlog (the kernel caps it at net.core.somaxconn, 4096 by default):
    # more than a flood holds beyond the connection cap (webhook: 2,000 - 256), so a full accept queue
    # does not drop the scraper's SYN (its retry comes 1 s later)
    limits: ServerLimits = ServerLimits()
    busy_response: Optional[bytes] = BUSY_RESPONSE
    accept_backoff_seconds = (0.05, 1.0)
    body_buffer_bytes = 0
    """A body (by its Content-Length) up to this size is received in the loop, before a worker
    gets the request, so a client trickling its body holds no worker; larger ones are read by
    the worker. 0: bodies are the worker's (the sidecar's requests have none)."""
    body_budget_bytes = 0
    """All the bytes the loop may hold for waiting requests; over it, the connection holding
    the most is closed (``over_capacity``)."""
    tick_seconds = 0.1
    accepts_per_turn = 64
    socket: Any
    RequestHandlerClass: Any

    def init_limits(self, limits: ServerLimits, errors: Optional[ServerErrors] = None) -> None:
        self.limits = limits
        self.errors = errors or ServerErrors()
        self.cap = 0  # claimed when serving starts (a server that fails to bind claims nothing)
        self.table = ConnectionTable()
        self._back: deque[tuple[Connection, bool]] = deque()
        self._work = threading.Condition()
        """Guards ``table.ready`` between the loop (which adds) and the workers (which take)."""
        self._workers_stop = False
        self._wake_r: Optional[socket.socket] = None
        self._wake_w: Optional[socket.socket] = None
        self._selector = selectors.DefaultSelector()
        self._stopping, self._stopped = threading.Event(), threading.Event()
        self._stopped.set()
        self._backoff, self._paused_until, self._swept = 0.0, 0.0, 0.0
        self._local = threading.local()

    def count(self, reason: str) -> None:
        self.errors.count(reason)

    # --- what handlers call, in their worker thread ---

    def reader(self) -> ConnectionReader:
        """The ``rfile`` of the request this thread answers."""
        return ConnectionReader(self._local.conn)

    def received(self) -> None:
        """The request is read whole: answering it is not under the request deadline."""
        self._local.conn.due = NEVER

    # --- the loop ---

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        self._workers_stop = False
        self.cap = DESCRIPTORS.claim(self.limits.max_connections)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        for i in range(self.limits.workers):
            threading.Thread(target=self._work_loop, name=f"oomsight-http-{i}", daemon=True).start()
        self.socket.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        try:
            while not self._stopping.is_set():
                self._turn()
        finally:
            for conn in [*self.table.waiting, *self.table.lingering]:
                self._close(conn)
            self._selector.close()
            self._stopped.set()

    def shutdown(self) -> None:
        self._stopping.set()
        self._wake()
        self._stopped.wait(10.0)

    def close_limits(self) -> None:
        """Stop the workers, give back the descriptors claimed (after :meth:`shutdown`)."""
        if self._wake_r is None:
            return  # never served
        with self._work:
            self._workers_stop = True
            self._work.notify_all()
        DESCRIPTORS.release(self.cap)
        self.cap = 0
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None

    def _turn(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._selector.register(self.socket, selectors.EVENT_READ, _LISTENER)
        for key, _events in self._selector.select(self.tick_seconds):
            if key.data is _LISTENER:
                self._accept()
            elif key.data is _WAKE:
                self._take_back()
            elif key.data in self.table.waiting:
                self._on_ready(key.data)
            elif key.data in self.table.lingering:
                self._drain(key.data)
        if time.monotonic() - self._swept >= self.tick_seconds:
            self._sweep()

    def _accept(self) -> None:
        for _ in range(self.accepts_per_turn):
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._out_of_descriptors(exc)
                return
            self._backoff = 0.0
            self._admit(sock, address)

    def _out_of_descriptors(self, exc: OSError) -> None:
        """Count, close the idlest connection, and stop accepting for a while: the listening
        socket stays readable, accepting again at once would spin at 100 % CPU."""
        self.count("out_of_descriptors")
        low, high = self.accept_backoff_seconds
        if not self._backoff:  # once per episode: it is counted every time
            logger.warning(
                "oomsight: cannot accept connections (%s): out of file descriptors; "
                "closing the idlest connection and pausing up to %.0f s between attempts",
                exc.strerror,
                high,
            )
        self._backoff = min(high, max(low, self._backoff * 2))
        self._evict_idlest()
        self._paused_until = time.monotonic() + self._backoff
        self._selector.unregister(self.socket)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        if self.table.full(self.cap) and not self._evict_idlest():
            self.count("over_capacity")  # every connection has a whole request: refuse the newcomer
            self._refuse(sock)
            return
        now = time.monotonic()
        sock.setblocking(False)
        conn = Connection(sock, address, now, now + self.limits.request_timeout_seconds)
        self._hold(conn)

    def _evict_idlest(self) -> bool:
        """Close a connection to make room: one already answered and closing (uncounted), else
        the idlest (longest without a byte) of the client that holds the most waiting
        connections; False if none waits."""
        found = self.table.victim()
        if found is None:
            return False
        conn, refused = found
        if refused:
            self.count("over_capacity")
        self._close(conn)
        return True

    def _refuse(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if self.busy_response is not None:
                sock.setblocking(False)
                sock.send(self.busy_response)
        with contextlib.suppress(OSError):
            sock.close()

    def _on_ready(self, conn: Connection) -> None:
        self.table.touch(conn, time.monotonic())
        if not conn.tls_done and not self._handshake(conn):
            return
        if self._receive(conn):
            self._examine(conn)

    def _handshake(self, conn: Connection) -> bool:
        sock: Any = conn.sock
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._listen_for(conn, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._listen_for(conn, selectors.EVENT_WRITE)
            return False
        except (ssl.SSLError, OSError) as exc:
            self._close(conn, "tls_handshake" if isinstance(exc, ssl.SSLError) else "request")
            return False
        conn.tls_done = True
        self._listen_for(conn, selectors.EVENT_READ)
        return True

    def _listen_for(self, conn: Connection, events: int) -> None:
        if conn.events != events:
            conn.events = events
            self._selector.modify(conn.sock, events, conn)

    def _receive(self, conn: Connection) -> bool:
        """Read what has arrived, up to one byte over the head cap (or to the end of a body
        received here); False if it closed."""
        room = (conn.need or self.limits.max_head_bytes + 1) - len(conn.buffer)
        while room > 0:
            try:
                data = conn.sock.recv(min(room, READ_BYTES))
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return True
            except OSError:  # ssl.SSLError included: a reset or a broken record
                self._close(conn, "request")
                return False
            if not data:
                self._close(conn)
                return False
            self.table.arrived(conn, data)
            room -= len(data)
            pending = getattr(conn.sock, "pending", None)
            if pending is None or not pending():
                return True  # more arrives as another readable event
        return True

    def _examine(self, conn: Connection) -> None:
        """Hand a whole request head (and a body of up to ``body_buffer_bytes``) to a worker;
        answer a bad or oversized one and close."""
        if self.body_budget_bytes and self.table.buffered > self.body_budget_bytes:
            self._shed_bytes()
            if conn not in self.table.waiting:
                return
        buf, cap = conn.buffer, self.limits.max_head_bytes
        if conn.need:
            if len(buf) >= conn.need:
                self._dispatch(conn)
            return
        line_end = buf.find(b"\n")
        if line_end < 0:
            if not _request_line_start(bytes(buf)):
                self._answer(conn, b"400 Bad Request")  # a TLS ClientHello, junk: at once, never held
            elif len(buf) > cap:
                self._answer(conn, b"431 Request Header Fields Too Large")
            return
        if not _request_line_ok(bytes(buf[:line_end])):
            self._answer(conn, b"400 Bad Request")  # HTTP/0.9 and junk: answered, never held
            return
        end = _head_end(buf, line_end)
        if end < 0 and len(buf) <= cap:
            return
        if end < 0 or end > cap:
            self._answer(conn, b"431 Request Header Fields Too Large")
            return
        length = _content_length(bytes(buf[:end])) if self.body_buffer_bytes else 0
        if 0 < length <= self.body_buffer_bytes and len(buf) < end + length:
            conn.need = end + length  # wait here for the body: a trickled one holds no worker
            self._on_ready(conn)  # what already arrived past the head cap
            return
        self._dispatch(conn)

    def _shed_bytes(self) -> None:
        """Over the body budget: close the waiting connection holding the most bytes."""
        self._close(self.table.largest(), "over_capacity")

    def _answer(self, conn: Connection, status: bytes) -> None:
        text = status + b"\r\n"
        head = b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        with contextlib.suppress(OSError):  # best effort: the client may be gone or not reading
            conn.sock.send(head % (status, len(text)) + text)
        self.count("request")
        self._linger(conn)

    def _dispatch(self, conn: Connection) -> None:
        self._forget(conn)
        with self._work:
            self.table.dispatch(conn)
            self._work.notify()

    def _take_back(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            while self._wake_r.recv(4096):  # type: ignore[union-attr]
                pass
        now = time.monotonic()
        while self._back:
            conn, keep = self._back.popleft()
            self.table.returned(conn)
            if not keep or conn.cut or self._stopping.is_set():
                self._linger(conn)
                continue
            conn.sock.setblocking(False)
            conn.last_byte = now
            conn.due = now + self.limits.idle_timeout_seconds + self.limits.request_timeout_seconds
            conn.events = selectors.EVENT_READ
            self._hold(conn)
            pending = getattr(conn.sock, "pending", None)
            if pending is not None and pending():
                self._on_ready(conn)
            elif conn.buffer:
                self._examine(conn)  # a pipelined request is already here

    def _linger(self, conn: Connection) -> None:
        """Close after the answer without losing it: send FIN, then read and drop what the
        client still sends (an unread body) until it closes or :data:`LINGER_SECONDS` pass;
        closing with unread bytes would send a reset that can destroy the answer in flight."""
        self._forget(conn)
        try:
            conn.sock.setblocking(False)
            conn.sock.shutdown(socket.SHUT_WR)  # an SSLSocket drops its TLS layer here: raw bytes follow
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                conn.sock.close()
            return
        self.table.linger(conn, time.monotonic() + LINGER_SECONDS)

    def _drain(self, conn: Connection) -> None:
        try:
            while conn.sock.recv(READ_BYTES):
                pass
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._close(conn)

    def _sweep(self) -> None:
        """Close connections past their request deadline or silent past the idle timeout;
        cut off requests still being read in a worker past their deadline."""
        now = self._swept = time.monotonic()
        for conn, past_deadline in self.table.expired(now, self.limits.idle_timeout_seconds):
            self._close(conn, "deadline" if past_deadline else None)
        for conn in self.table.drained(now):
            self._close(conn)
        for conn in self.table.cut_overdue(now):
            self.count("deadline")
            with contextlib.suppress(OSError):  # the worker's blocked read returns, it cleans up
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _close(self, conn: Connection, reason: Optional[str] = None) -> None:
        if reason is not None:
            self.count(reason)
        self._forget(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _forget(self, conn: Connection) -> None:
        """No longer held by the loop (closed, closing, or handed to a worker)."""
        if self.table.forget(conn):
            self._selector.unregister(conn.sock)

    def _hold(self, conn: Connection) -> None:
        """Wait in the loop for its request; the newest activity of its client."""
        self.table.hold(conn)
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _wake(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # a wake is already pending; or not serving
            self._wake_w.send(b"x")  # type: ignore[union-attr]

    # --- the workers ---

    def _work_loop(self) -> None:
        while (conn := self._next_request()) is not None:
            keep = self._serve(conn)
            self._back.append((conn, keep))
            self._wake()

    def _next_request(self) -> Optional[Connection]:
        """The next whole request, round-robin over clients (``table.next_ready``); None once
        the server stops."""
        with self._work:
            while not self._workers_stop:
                conn = self.table.next_ready()
                if conn is not None:
                    return conn
                self._work.wait()
        return None

    def _serve(self, conn: Connection) -> bool:
        """Answer the request whose head ``conn`` holds; True to keep the connection."""
        self._local.conn = conn
        try:
            conn.sock.settimeout(self.limits.idle_timeout_seconds)
            handler = self.RequestHandlerClass(conn.sock, conn.address, self)
            return bool(getattr(handler, "keep_alive", False))
        except Exception:
            self.handle_error(conn.sock, conn.address)  # type: ignore[attr-defined]
            return False
        finally:
            self._local.conn = None


def _request_line_ok(line: bytes) -> bool:
    """``METHOD target HTTP/x.y``: HTTP/0.9's two words and anything else are refused."""
    words = line.split()
    return len(words) == 3 and words[2].startswith(b"HTTP/")


_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]"
_REQUEST_LINE_START = re.compile(
    rb"[ \t]*(?:" + _TOKEN + rb"+"  # the method
    rb"(?:[ \t]+(?:[\x21-\x7e]+"  # the target
    rb"(?:[ \t]+(?:H(?:T(?:T(?:P(?:/[\x21-\x7e]*[ \t\r]*)?)?)?)?)?)?)?)?)?"  # the version, cut anywhere
)
"""What a request line can start with before its line end: ``METHOD target HTTP/x.y`` cut
anywhere, as leniently as :func:`_request_line_ok` reads the whole line."""


def _request_line_start(data: bytes) -> bool:
    """Whether ``data`` (no line end yet) can still become a request line; a TLS ClientHello
    (its first byte 0x16) or other binary or junk cannot, and is refused before it is whole."""
    return _REQUEST_LINE_START.fullmatch(data) is not None


_CONTENT_LENGTH = re.compile(rb"\ncontent-length:[ \t]*([0-9]{1,12})[ \t]*\r?\n")


def _content_length(head: bytes) -> int:
    """The first ``Content-Length`` of a request head, as the handler reads it; 0 if none, and
    0 when the client waits for ``100 Continue`` before it sends the body (the handler says it)."""
    lowered = head.lower()
    found = _CONTENT_LENGTH.search(lowered)
    return int(found.group(1)) if found and b"\nexpect:" not in lowered else 0


def _head_end(buf: bytearray, line_end: int) -> int:
    """Where the head ending with the first blank line after ``line_end`` ends; -1 if not yet."""
    ends = [i + len(sep) for sep in (b"\n\r\n", b"\n\n") if (i := buf.find(sep, line_end)) >= 0]
    return min(ends, default=-1)


def address_family(host: str) -> socket.AddressFamily:
    """``AF_INET6`` for an IPv6 literal (``::1``, ``::``), else ``AF_INET``."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
