"""The webhook's HTTPS endpoint: ``POST /mutate`` (AdmissionReview), ``GET /healthz``.

An HTTP/1.1 server on :mod:`oomsight_server.listener`: its event loop does each TLS
handshake and waits for each request head, under the request deadline, so silent, slow or
plain-text clients hold no thread; it receives each body up to ``max_review_bytes`` too,
so a client trickling its review holds no worker either; a few workers answer. A
kept-alive connection goes back to the loop between reviews; over the connection cap a
waiting connection of the client holding the most is closed, so the API server's new
connection is served. Request bodies
need a ``Content-Length`` and are refused unread above ``max_body_bytes``; a body over
``max_review_bytes`` is read through in chunks, only its head kept (fail-open answer).
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Optional

from oomsight_server.listener import BoundedServer, ServerLimits, address_family
from oomsight_webhook.admission import HEAD_BYTES, Admitter

logger = logging.getLogger(__name__)

MUTATE_PATH = "/mutate"
READ_CHUNK_BYTES = 64 * 1024
BODY_BUDGET_REVIEWS = 16
"""Reviews of ``max_review_bytes`` the event loop may hold while their bodies arrive (16 MiB
with the defaults); over it the connection holding the most is closed."""


class AdmissionServer(BoundedServer, HTTPServer):
    busy_response = None  # over the cap a TLS connection is closed: there is no plain-text 503

    def __init__(
        self,
        address: tuple[str, int],
        context: ssl.SSLContext,
        admitter: Admitter,
        limits: Optional[ServerLimits] = None,
    ) -> None:
        self.address_family = address_family(address[0])
        self.init_limits(limits or ServerLimits(request_timeout_seconds=10.0, workers=4))
        self.body_buffer_bytes = admitter.limits.max_review_bytes  # a trickled review holds no worker
        self.body_budget_bytes = BODY_BUDGET_REVIEWS * admitter.limits.max_review_bytes
        super().__init__(address, _Handler)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.admitter = admitter

    def count_error(self, component: str) -> None:
        self.count(component)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake or broken connection: count it, log at debug, carry on."""
        exc = sys.exc_info()[1]
        self.count_error("tls_handshake" if isinstance(exc, ssl.SSLError) else "request")
        logger.debug("oomsight webhook: connection from %s failed: %r", client_address, exc)


class _Handler(BaseHTTPRequestHandler):
    server: AdmissionServer
    protocol_version = "HTTP/1.1"
    server_version = "oomsight-webhook"
    sys_version = ""

    keep_alive = False

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = self.server.reader()  # type: ignore[assignment]

    def handle(self) -> None:
        """One request; a kept-alive connection then waits in the server's loop, not here."""
        self.close_connection = True
        self.handle_one_request()
        self.keep_alive = not self.close_connection

    def do_POST(self) -> None:
        if self.path.split("?")[0] != MUTATE_PATH:
            self._discard_body()
            return self._send(404, b"not found\n", "text/plain")
        length = self._content_length()
        if length is None:
            return
        body = self._read_body(length)
        self.server.received()  # answering is not under the read deadline
        if body is None:
            self.close_connection = True
            return self._send(400, b"body shorter than Content-Length\n", "text/plain")
        answer = self.server.admitter.admit(body, self.headers.get("Content-Type"), length)
        self._send(answer.status, answer.body, answer.content_type)

    def do_GET(self) -> None:
        self.server.received()
        if self.path in ("/healthz", "/readyz"):
            return self._send(200, b"ok\n", "text/plain")
        self._send(404, b"not found\n", "text/plain")

    def _content_length(self) -> int | None:
        raw = (self.headers.get("Content-Length") or "").strip()
        limit = self.server.admitter.max_body_bytes
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 12):
            self.close_connection = True
            self._send(411, b"Content-Length required\n", "text/plain")
            return None
        length = int(raw)
        if length > limit:
            self.close_connection = True  # the body stays unread: this connection cannot be reused
            self.server.admitter.reject_oversized(length)
            self._send(413, f"body of {length} bytes is over the limit of {limit}\n".encode(), "text/plain")
            return None
        return length

    def _read_body(self, length: int) -> bytes | None:
        """The body in chunks; of a body over ``max_review_bytes`` only the head is kept.
        None when the client stops short (or the request deadline cut the connection)."""
        keep = length if length <= self.server.admitter.limits.max_review_bytes else HEAD_BYTES
        parts: list[bytes] = []
        kept, left = 0, length
        while left > 0:
            try:
                chunk = self.rfile.read(min(READ_CHUNK_BYTES, left))
            except OSError:
                return None
            if not chunk:
                return None
            left -= len(chunk)
            if kept < keep:
                parts.append(chunk[: keep - kept])
                kept += len(parts[-1])
        return b"".join(parts)

    def _discard_body(self) -> None:
        self.close_connection = True

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("oomsight webhook: " + format, *args)


def serve(server: AdmissionServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="oomsight-webhook", daemon=True)
    thread.start()
    return thread


def bound_port(server: AdmissionServer) -> int:
    sock: socket.socket = server.socket
    return int(sock.getsockname()[1])
