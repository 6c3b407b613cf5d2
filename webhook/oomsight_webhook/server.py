"""The webhook's HTTPS endpoint: ``POST /mutate`` (AdmissionReview), ``GET /healthz``.

A threading HTTP/1.1 server (the API server keeps connections alive) whose sockets
do their TLS handshake in the request thread, under the request timeout, so a slow
or plain-text client never stalls the accept loop. Request bodies need a
``Content-Length`` and are refused unread above the limit.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from oomsight_webhook.admission import Admitter

logger = logging.getLogger(__name__)

MUTATE_PATH = "/mutate"
REQUEST_TIMEOUT_SECONDS = 10.0


class AdmissionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext, admitter: Admitter) -> None:
        super().__init__(address, _Handler)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.admitter = admitter
        self.errors: Counter[str] = Counter(tls_handshake=0, request=0)
        self._lock = threading.Lock()

    def count_error(self, component: str) -> None:
        with self._lock:
            self.errors[component] += 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake or broken connection: count it, log at debug, carry on."""
        exc = sys.exc_info()[1]
        self.count_error("tls_handshake" if isinstance(exc, ssl.SSLError) else "request")
        logger.debug("oomsight webhook: connection from %s failed: %r", client_address, exc)


class _Handler(BaseHTTPRequestHandler):
    server: AdmissionServer
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT_SECONDS
    server_version = "oomsight-webhook"
    sys_version = ""

    def do_POST(self) -> None:
        if self.path.split("?")[0] != MUTATE_PATH:
            self._discard_body()
            return self._send(404, b"not found\n", "text/plain")
        length = self._content_length()
        if length is None:
            return
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return self._send(400, b"body shorter than Content-Length\n", "text/plain")
        answer = self.server.admitter.admit(body, self.headers.get("Content-Type"))
        self._send(answer.status, answer.body, answer.content_type)

    def do_GET(self) -> None:
        if self.path in ("/healthz", "/readyz"):
            return self._send(200, b"ok\n", "text/plain")
        self._send(404, b"not found\n", "text/plain")

    def _content_length(self) -> int | None:
        raw = self.headers.get("Content-Length")
        limit = self.server.admitter.max_body_bytes
        if raw is None or not raw.strip().isdigit():
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
