"""Serving a WSGI application on the bounded listener: :func:`serve` and :func:`stop`.

The sidecar's ``/metrics`` and admin endpoint and the webhook's plain ``/metrics`` are WSGI
apps served this way (the webhook's HTTPS endpoint has its own handler on the same
:class:`~oomsight_server.listener.BoundedServer`). wsgiref answers HTTP/1.0, one request per
connection; a broken or slow client is counted (``request``) and logged at debug only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Callable, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from oomsight_server.listener import BoundedServer, ServerErrors, ServerLimits, address_family

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Server(BoundedServer, WSGIServer):
    def __init__(self, address: tuple[str, int], limits: ServerLimits, errors: Optional[ServerErrors]) -> None:
        self.address_family = address_family(address[0])
        self.init_limits(limits, errors)
        super().__init__(address, _QuietHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away, timed out or sent too much: count, log at debug, carry on."""
        self.count("request")
        logger.debug("oomsight: connection from %s failed", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = self.server.reader()  # type: ignore[assignment]

    def parse_request(self) -> bool:
        received = super().parse_request()
        if received:  # requests here have no body: the deadline no longer applies to this one
            self.server.received()
        return received

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape is noise; errors surface as metrics


def serve(
    app: WsgiApp, host: str, port: int, limits: Optional[ServerLimits] = None, errors: Optional[ServerErrors] = None
) -> WSGIServer:
    """Bind and serve ``app`` in a daemon thread; the caller calls :func:`stop`. ``errors``:
    where it counts what it refuses (one :class:`ServerErrors` for all servers of a process).
    One request per connection (wsgiref answers HTTP/1.0 and closes)."""
    server = _Server((host, port), limits or ServerLimits(), errors)
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="oomsight-http", daemon=True).start()
    return server


def stop(server: WSGIServer) -> None:
    """Stop serving and close the listening socket and the worker threads."""
    server.shutdown()
    server.server_close()
    if isinstance(server, BoundedServer):
        server.close_limits()
