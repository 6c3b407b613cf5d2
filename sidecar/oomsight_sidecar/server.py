"""HTTP endpoints of the sidecar: ``/metrics``, ``/healthz``, ``/readyz`` and a landing page.

``/metrics`` answers a ``GET`` as prometheus_client's own WSGI app does (its content
negotiation, OpenMetrics, gzip), with the text the spool collector builds on every scrape
(``oomsight.metrics.collector``: byte for byte what the negotiated encoder writes, each process's
unchanged document samples written once per snapshot file and encoder); anything
else on ``/metrics`` (``OPTIONS``, ``name[]`` filters) goes to prometheus_client's app itself.
The other paths are a few lines of WSGI, served by :mod:`oomsight_server.wsgi`. ``HEAD`` is
answered on every path with the headers ``GET`` would have.

Probes follow what ``/metrics`` can do (docs/kubernetes.md, "Probes"):

* ``/readyz`` is 503 until the spool was read once, while the last collect raised,
  and while a collect has been running longer than ``hung_after_seconds``;
* ``/healthz`` is 500 while a collect has been running longer than
  ``hung_after_seconds`` (a reader stuck on a hung filesystem): the kubelet restarts
  the sidecar instead of Prometheus timing out on it forever.
"""

from __future__ import annotations

import gzip
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from oomsight.metrics.collector import SpoolCollector
from oomsight_server.listener import ServerErrors
from oomsight_server.wsgi import StartResponse, WsgiApp
from oomsight_sidecar.heap import Trim

logger = logging.getLogger(__name__)

LANDING = b"""<html><head><title>oomsight sidecar</title></head><body>
<h1>oomsight sidecar</h1><p><a href="/metrics">/metrics</a> | <a href="/healthz">/healthz</a> |
<a href="/readyz">/readyz</a></p></body></html>"""


class CollectWatch:
    """Which collects are running since when, and whether the last one raised."""

    def __init__(self, hung_after_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hung_after_seconds = hung_after_seconds
        self.clock = clock
        self.last_error: Optional[str] = None
        self._running: dict[int, float] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def run(self, collect: Callable[[], Any]) -> Any:
        """``collect()``, timed; its exception is recorded and raised again."""
        with self._lock:
            key = next(self._ids)
            self._running[key] = self.clock()
        try:
            result = collect()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            raise
        else:
            self.last_error = None
            return result
        finally:
            with self._lock:
                del self._running[key]

    def hung_seconds(self) -> float:
        """How long the oldest running collect has run, when over the limit; else 0."""
        with self._lock:
            oldest = min(self._running.values(), default=None)
        age = 0.0 if oldest is None else self.clock() - oldest
        return age if age > self.hung_after_seconds else 0.0


class MetricsApp:
    """The WSGI application. Ready once the spool has been read successfully.

    ``others``: the sidecar's own collectors (Kubernetes, HTTP errors), served after the
    spool's families; ``registry`` holds the spool collector and them.
    """

    def __init__(
        self,
        collector: SpoolCollector,
        others: Optional[CollectorRegistry] = None,
        watch: Optional[CollectWatch] = None,
        trim: Optional[Trim] = None,
    ) -> None:
        self.collector = collector
        self.others = others
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        if others is not None:
            self.registry.register(others)
        self.metrics: WsgiApp = make_wsgi_app(self.registry)
        self.watch = watch or CollectWatch(hung_after_seconds=20.0)
        self.ready = threading.Event()
        self.trim = trim or Trim()
        """Free heap pages given back after a scrape (``oomsight_sidecar.heap``)."""

    def check_ready(self) -> bool:
        if not self.ready.is_set() and self.collector.reader.read().readable:
            self.ready.set()
        return self.ready.is_set()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "HEAD":
            return head(self._route, environ, start_response)
        return self._route(environ, start_response)

    def _route(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        if path == "/healthz":
            hung = self.watch.hung_seconds()
            if hung:
                return _text(start_response, "500 Internal Server Error", f"a collect is hung for {hung:.0f} s\n")
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            reason = self._not_ready_reason()
            if reason:
                return _text(start_response, "503 Service Unavailable", reason + "\n")
            return _text(start_response, "200 OK", "ready\n")
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING]
        return _text(start_response, "404 Not Found", "not found\n")

    def _metrics(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            result: Iterable[bytes] = self.watch.run(lambda: self._metrics_answer(environ, start_response))
        except Exception:
            logger.exception("oomsight sidecar: collecting metrics failed; /readyz answers 503 until one succeeds")
            raise
        if self.collector.last_inventory is not None and self.collector.last_inventory.readable:
            self.ready.set()
        self.trim()
        return result

    def _metrics_answer(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """prometheus_client's answer (``_bake_output`` of ``make_wsgi_app``), built for this scrape."""
        if environ.get("REQUEST_METHOD") != "GET" or "name[]" in parse_qs(environ.get("QUERY_STRING", "")):
            return self.metrics(environ, start_response)
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        body = self.collector.exposition(encoder, content_type, self.others)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    def _not_ready_reason(self) -> str:
        hung = self.watch.hung_seconds()
        if hung:
            return f"a collect is running for {hung:.0f} s"
        if not self.check_ready():
            return "spool not readable yet"
        if self.watch.last_error is not None:
            try:  # collect once more here: the probe must see a recovery without waiting for a scrape
                self.watch.run(lambda: self.collector.exposition(*choose_encoder(""), self.others))
            except Exception:
                return f"the last collect failed: {self.watch.last_error}"
        return ""


def head(app: WsgiApp, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
    """``HEAD``: the answer ``GET`` would get, with its length, without its body."""
    seen: dict[str, Any] = {}

    def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        seen["status"], seen["headers"] = status, headers
        return lambda _data: None

    body = b"".join(app({**environ, "REQUEST_METHOD": "GET"}, keep))
    headers = [(k, v) for k, v in seen["headers"] if k.lower() != "content-length"]
    start_response(seen["status"], [*headers, ("Content-Length", str(len(body)))])
    return []


def _text(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
    return [body]


class ServerCollector(Collector):
    """``oomsight_sidecar_http_errors_total``: what the sidecar's servers refused or cut off."""

    def __init__(self, errors: ServerErrors) -> None:
        self.errors = errors

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "oomsight_sidecar_http_errors",
            "Connections the sidecar's metrics and admin servers refused or cut off, by reason: request "
            "(broken, timed out or too large), over_capacity, out_of_descriptors, deadline.",
            labels=["reason"],
        )
        for reason, n in self.errors.counts().items():
            family.add_metric([reason], n)
        yield family
