"""A loopback stand-in for the API server's ResourceClaim listing, paged as the real one pages
(``limit`` and ``continue``), over HTTP or HTTPS, for the real ``KubeClient`` and the real sidecar.

The claims are kept serialized (one JSON text per claim, the same text repeated for the foreign
ones), so 50,000 claims of other pods cost the test process little; a page is joined when asked for.
``raw`` replaces the answer with any bytes (a listing whose ``items`` is ``5``, a body that is not
JSON). Other requests (the sidecar's Events) are answered 201 with their body.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"


class _Handler(BaseHTTPRequestHandler):
    server: ClaimsServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as Go servers do: no 40 ms wait between the head and the body

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path != CLAIMS_PATH.format(namespace=self.server.namespace):
            self._send(404, b'{"kind":"Status","status":"Failure","code":404}')
            return
        limit = int(query["limit"]) if "limit" in query else None
        start = int(query.get("continue") or 0)
        self.server.requests.append((limit, query.get("continue", "")))
        self._send(200, self.server.page(start, limit))

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(201, body or b"{}")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client read what it wanted and closed
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ClaimsServer(ThreadingHTTPServer):
    """``own`` claims after ``foreign`` copies of ``foreign_claim``; ``pages_served`` and the largest page
    in bytes are recorded with each request's ``(limit, continue)``."""

    daemon_threads = True

    def __init__(
        self,
        namespace: str,
        own: list[dict[str, Any]],
        foreign_claim: Optional[dict[str, Any]] = None,
        foreign: int = 0,
        raw: Optional[Callable[[int, Optional[int]], bytes]] = None,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.namespace = namespace
        self._own = [json.dumps(c).encode() for c in own]
        self._foreign = json.dumps(foreign_claim).encode() if foreign_claim is not None else b"{}"
        self.foreign = foreign
        self.raw = raw
        self.requests: list[tuple[Optional[int], str]] = []
        self.largest_page = 0

    def _item(self, i: int) -> bytes:
        return self._foreign if i < self.foreign else self._own[i - self.foreign]

    def page(self, start: int, limit: Optional[int]) -> bytes:
        if self.raw is not None:
            return self.raw(start, limit)
        total = self.foreign + len(self._own)
        end = total if not limit else min(total, start + limit)
        more = str(end) if end < total else ""
        head = b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimList","metadata":{"continue":"%s"},"items":['
        body = head % more.encode() + b",".join(self._item(i) for i in range(start, end)) + b"]}"
        self.largest_page = max(self.largest_page, len(body))
        return body


@contextmanager
def claims_server(server: ClaimsServer, tls_dir: Optional[str] = None) -> Iterator[ClaimsServer]:
    """``server`` answering on loopback in a thread; over HTTPS with a fresh CA when ``tls_dir`` is given
    (``ca.crt`` there, with a service account ``token``: what a pod has mounted)."""
    if tls_dir is not None:
        server.socket = _tls_context(tls_dir).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _tls_context(tls_dir: str) -> ssl.SSLContext:
    import datetime

    from oomsight_webhook.certs import make_ca, make_serving

    now = datetime.datetime.now(datetime.timezone.utc)
    ca = make_ca("loopback-api-ca", now)
    serving = make_serving(ca, ["localhost", "127.0.0.1"], now)
    paths = {name: os.path.join(tls_dir, name) for name in ("ca.crt", "tls.crt", "tls.key", "token")}
    for name, data in (("ca.crt", ca.cert_pem), ("tls.crt", serving.cert_pem), ("tls.key", serving.key_pem)):
        with open(paths[name], "wb") as fh:
            fh.write(data)
    with open(paths["token"], "w") as fh:
        fh.write("loopback-service-account-token")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(paths["tls.crt"], paths["tls.key"])
    return context


IN_POD = """
import sys
from kubernetes.config import incluster_config
from oomsight_server import kube
incluster_config.SERVICE_TOKEN_FILENAME = kube.SERVICE_TOKEN_FILE = sys.argv.pop(1)
incluster_config.SERVICE_CERT_FILENAME = sys.argv.pop(1)
from oomsight.tools.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""``python -c IN_POD TOKEN CA oomsight-arguments...``: the real command line, with the service account
files a pod has at ``/var/run/secrets/kubernetes.io/serviceaccount`` read from the test's folder instead
(the only change; ``KUBERNETES_SERVICE_HOST``/``PORT`` point at the loopback server)."""
