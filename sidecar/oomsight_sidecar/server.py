"""HTTP endpoints of the sidecar: ``/metrics``, ``/healthz``, ``/readyz`` and a landing page.

``/metrics`` is prometheus_client's own WSGI app (content negotiation, OpenMetrics,
gzip); the other paths are a few lines of WSGI around it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from oomsight.metrics.collector import SpoolCollector

StartResponse = Callable[..., Any]

LANDING = b"""<html><head><title>oomsight sidecar</title></head><body>
<h1>oomsight sidecar</h1><p><a href="/metrics">/metrics</a> | <a href="/healthz">/healthz</a> |
<a href="/readyz">/readyz</a></p></body></html>"""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape is noise; errors surface as metrics


class MetricsApp:
    """The WSGI application. Ready once the spool has been read successfully."""

    def __init__(self, collector: SpoolCollector, registry: CollectorRegistry) -> None:
        self.collector = collector
        self.metrics = make_wsgi_app(registry)
        self.ready = threading.Event()

    def check_ready(self) -> bool:
        if not self.ready.is_set() and self.collector.reader.read().readable:
            self.ready.set()
        return self.ready.is_set()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            result: Iterable[bytes] = self.metrics(environ, start_response)
            if self.collector.last_inventory is not None and self.collector.last_inventory.readable:
                self.ready.set()
            return result
        if path == "/healthz":
            return _text(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            if self.check_ready():
                return _text(start_response, "200 OK", b"ready\n")
            return _text(start_response, "503 Service Unavailable", b"spool not readable yet\n")
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING]
        return _text(start_response, "404 Not Found", b"not found\n")


def _text(start_response: StartResponse, status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
    return [body]


def serve(app: Callable[..., Iterable[bytes]], host: str, port: int) -> WSGIServer:
    """Bind and serve in a daemon thread; the caller calls ``shutdown()``."""
    return serve_wsgi(app, host, port)


def serve_wsgi(app: Callable[..., Iterable[bytes]], host: str, port: int) -> WSGIServer:
    """Any WSGI app (the webhook's ``/metrics``) on the same quiet threading server."""
    server = make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="oomsight-http", daemon=True).start()
    return server
