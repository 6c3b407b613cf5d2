"""The HTTP listener under every oomsight server (sidecar metrics and admin, webhook).

What the standard library's threading servers lack and a pod needs (docs/kubernetes.md,
"Server limits"):

* a **connection cap**: a bounded number of handler threads; a connection over the cap
  gets ``503`` (plain HTTP) or is closed (TLS) at once, in the accept thread;
* an **idle timeout** (a socket timeout: a connection silent that long is closed) and a
  **request deadline** (a request, headers and body, that takes longer in all to arrive
  is cut off, so a client trickling a byte every few seconds cannot hold a thread);
* a **request-head cap**: request line and headers larger than ``max_head_bytes`` close
  the connection;
* **back-off at the descriptor limit**: when ``accept()`` fails with ``EMFILE`` the
  loop sleeps instead of spinning at 100 % CPU on the still-readable listening socket;
* **IPv6**: a listen address with a colon (``::1``, ``::``) gets an ``AF_INET6`` socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Optional

from oomsight.config import env_setting, parse_count, parse_seconds

logger = logging.getLogger(__name__)

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 22\r\n"
    b"Connection: close\r\nRetry-After: 1\r\n\r\ntoo many connections\r\n"
)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Limits of one HTTP server; read from ``<PREFIX>_MAX_CONNECTIONS`` and friends."""

    max_connections: int = 32
    """Connections served at once (one thread each); more are refused at once."""

    idle_timeout_seconds: float = 15.0
    """A connection that sends nothing for this long is closed (the socket timeout)."""

    request_timeout_seconds: float = 30.0
    """Longest time to receive one request, head and body (from the connection's start, or
    from the previous answer on a kept-alive one). Writing the answer is not limited by it
    (a large artifact download may take longer), only by the idle timeout per write."""

    max_head_bytes: int = 32 * 1024
    """Largest request line plus headers; larger requests close the connection."""

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str, default: Optional[ServerLimits] = None) -> ServerLimits:
        """``OOMSIGHT_SIDECAR`` or ``OOMSIGHT_WEBHOOK`` + ``_MAX_CONNECTIONS`` and so on;
        what is unset comes from ``default`` (the component's own defaults)."""
        d = default or cls()
        hour = functools.partial(parse_seconds, minimum=0.1, maximum=3600.0)
        return cls(
            max_connections=env_setting(
                env, f"{prefix}_MAX_CONNECTIONS", functools.partial(parse_count, maximum=10_000), d.max_connections
            ),
            idle_timeout_seconds=env_setting(env, f"{prefix}_IDLE_TIMEOUT_SECONDS", hour, d.idle_timeout_seconds),
            request_timeout_seconds=env_setting(
                env, f"{prefix}_REQUEST_TIMEOUT_SECONDS", hour, d.request_timeout_seconds
            ),
            max_head_bytes=env_setting(
                env, f"{prefix}_MAX_HEAD_BYTES", functools.partial(parse_count, minimum=1024), d.max_head_bytes
            ),
        )


def limit_env_names(prefix: str) -> tuple[str, ...]:
    """The variables :meth:`ServerLimits.from_env` reads for ``prefix`` (for the docs test)."""
    names = ("MAX_CONNECTIONS", "IDLE_TIMEOUT_SECONDS", "REQUEST_TIMEOUT_SECONDS", "MAX_HEAD_BYTES")
    return tuple(f"{prefix}_{n}" for n in names)


class HeadTooLarge(OSError):
    """The request line and headers are over ``max_head_bytes``; the connection is closed."""


class CappedReader:
    """Wraps a handler's ``rfile``: ``readline`` (request line, headers) counts against a cap.

    ``read`` (the body) is not counted: bodies have their own limit, by Content-Length."""

    def __init__(self, raw: Any, cap: int) -> None:
        self.raw = raw
        self.cap = cap
        self.used = 0

    def readline(self, limit: int = -1) -> bytes:
        room = self.cap - self.used
        if room <= 0:
            raise HeadTooLarge(f"request head over {self.cap} bytes")
        line: bytes = self.raw.readline(room if limit < 0 else min(limit, room))
        self.used += len(line)
        return line

    def reset(self) -> None:
        """A new request on a kept-alive connection starts its own count."""
        self.used = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


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


class Deadlines:
    """One thread that shuts down sockets whose request deadline has passed."""

    def __init__(self, errors: ServerErrors, tick_seconds: float = 0.25) -> None:
        self.tick_seconds = tick_seconds
        self.errors = errors
        self._due: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oomsight-deadlines", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, seconds: float) -> None:
        with self._lock:
            self._due[sock] = time.monotonic() + seconds

    def forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._due.pop(sock, None)

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            now = time.monotonic()
            with self._lock:
                late = [s for s, due in self._due.items() if due <= now]
                for sock in late:
                    del self._due[sock]
            if late:
                self.errors.count("deadline", len(late))
            for sock in late:
                with contextlib.suppress(OSError):  # already closed by its handler
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns, it cleans up


class BoundedServer(socketserver.ThreadingMixIn):
    """Mixed in before an ``HTTPServer``/``WSGIServer``: capped threads, deadlines, back-off.

    Call :meth:`init_limits` in ``__init__`` before ``super().__init__`` (set
    ``busy_response`` to None where a plain 503 cannot be sent, on a TLS port); call
    :meth:`close_limits` after ``server_close()``. ``errors`` counts what was refused or
    cut off (:data:`ERROR_REASONS`)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # the listen backlog: socketserver's 5 drops a burst of scrapes' SYNs
    limits: ServerLimits = ServerLimits()
    busy_response: Optional[bytes] = BUSY_RESPONSE
    accept_backoff_seconds = (0.05, 1.0)

    def init_limits(self, limits: ServerLimits, errors: Optional[ServerErrors] = None) -> None:
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        self.errors = errors or ServerErrors()
        self.deadlines = Deadlines(self.errors)
        self._backoff = 0.0

    def count(self, reason: str) -> None:
        self.errors.count(reason)

    def get_request(self) -> tuple[Any, Any]:
        try:
            conn, addr = super().get_request()  # type: ignore[misc]
        except OSError as exc:
            if exc.errno in _OUT_OF_DESCRIPTORS:
                self.count("out_of_descriptors")
                low, high = self.accept_backoff_seconds
                if not self._backoff:  # once per episode: it is counted every time
                    logger.warning(
                        "oomsight: cannot accept connections (%s): out of file descriptors; "
                        "pausing up to %.0f s between attempts",
                        exc.strerror,
                        high,
                    )
                self._backoff = min(high, max(low, self._backoff * 2))
                time.sleep(self._backoff)
            raise
        self._backoff = 0.0
        return conn, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.count("over_capacity")
            self._refuse(request)
            return
        request.settimeout(self.limits.idle_timeout_seconds)
        self.deadlines.watch(request, self.limits.request_timeout_seconds)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.deadlines.forget(request)
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.forget(request)
            self.slots.release()

    def _refuse(self, request: Any) -> None:
        try:
            if self.busy_response is not None:
                request.setblocking(False)
                request.send(self.busy_response)
        except OSError:
            pass  # the client is told nothing more than a closed connection
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def close_limits(self) -> None:
        self.deadlines.close()


def address_family(host: str) -> socket.AddressFamily:
    """``AF_INET6`` for an IPv6 literal (``::1``, ``::``), else ``AF_INET``."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET
