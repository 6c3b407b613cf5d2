"""The sidecar's admin endpoint: ask for a profiling window, list profiles, download
artifacts (memory snapshots, profiler tables and traces).

Bound to 127.0.0.1 by default — reach it with ``kubectl port-forward pod/<pod> 21401``.
Listening on any other address requires a bearer token (``OOMSIGHT_ADMIN_TOKEN`` or
``OOMSIGHT_ADMIN_TOKEN_FILE``); with a token set, every request must carry it.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

from oomsight.analysis.profile_plan import submit
from oomsight.config import ConfigError
from oomsight.wire.spool import ARTIFACTS, SpoolReader

ENV_ADMIN_HOST = "OOMSIGHT_ADMIN_HOST"
ENV_ADMIN_PORT = "OOMSIGHT_ADMIN_PORT"
ENV_ADMIN_TOKEN = "OOMSIGHT_ADMIN_TOKEN"
ENV_ADMIN_TOKEN_FILE = "OOMSIGHT_ADMIN_TOKEN_FILE"
DEFAULT_ADMIN_PORT = 21401
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
StartResponse = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class AdminSettings:
    host: str = "127.0.0.1"
    """Listen address; anything but loopback needs a token."""
    port: int = DEFAULT_ADMIN_PORT
    """Admin port; 0 turns the endpoint off."""
    token: Optional[str] = None
    """Bearer token every request must carry (required when not on loopback)."""

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> AdminSettings:
        e = os.environ if env is None else env
        token = e.get(ENV_ADMIN_TOKEN) or None
        if not token and e.get(ENV_ADMIN_TOKEN_FILE):
            try:
                with open(e[ENV_ADMIN_TOKEN_FILE], encoding="utf-8") as fh:
                    token = fh.read().strip() or None
            except OSError as exc:
                raise ConfigError(f"{ENV_ADMIN_TOKEN_FILE}: cannot read the token file ({exc})") from None
        try:
            port = int(e.get(ENV_ADMIN_PORT, DEFAULT_ADMIN_PORT))
        except ValueError:
            raise ConfigError(f"{ENV_ADMIN_PORT}={e.get(ENV_ADMIN_PORT)!r} is not a port number") from None
        settings = cls(host=e.get(ENV_ADMIN_HOST) or "127.0.0.1", port=port, token=token)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.port and not _loopback(self.host) and not self.token:
            raise ConfigError(
                f"the admin endpoint would listen on {self.host} without a token: set {ENV_ADMIN_TOKEN} "
                f"(or {ENV_ADMIN_TOKEN_FILE}), or keep {ENV_ADMIN_HOST}=127.0.0.1 and use kubectl port-forward"
            )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AdminApp:
    def __init__(self, spool_dir: str, token: Optional[str]) -> None:
        self.spool_dir = spool_dir
        self.token = token

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if self.token and not self._authorized(environ):
            return _json(start_response, 401, {"error": "missing or wrong bearer token"})
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        if path == "/admin/profile":
            if method != "POST":
                return _json(start_response, 405, {"error": "use POST"})
            query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
            try:
                steps = int(query.get("steps", ["5"])[0])
            except ValueError:
                return _json(start_response, 400, {"error": "steps must be a whole number"})
            memory_only = query.get("memory_only", ["0"])[0].lower()
            if memory_only not in ("0", "1", "false", "true"):
                return _json(start_response, 400, {"error": "memory_only must be 0/1 or false/true"})
            result = submit(self.spool_dir, steps, cuda_time=memory_only in ("0", "false"))
            return _json(start_response, result.status, result.body)
        if path == "/admin/profiles" and method == "GET":
            profiles = SpoolReader(self.spool_dir).read().profiles
            return _json(start_response, 200, {"profiles": profiles})
        if path.startswith("/admin/artifacts/") and method == "GET":
            return self._artifact(path.rsplit("/", 1)[1], start_response)
        return _json(start_response, 404, {"error": "not found"})

    def _authorized(self, environ: dict[str, Any]) -> bool:
        header = str(environ.get("HTTP_AUTHORIZATION", ""))
        given = header[7:] if header.startswith("Bearer ") else ""
        return hmac.compare_digest(given.encode(), (self.token or "").encode())

    def _artifact(self, name: str, start_response: StartResponse) -> Iterable[bytes]:
        if not _NAME.match(name):
            return _json(start_response, 400, {"error": "bad artifact name"})
        path = os.path.join(self.spool_dir, ARTIFACTS, name)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return _json(start_response, 404, {"error": f"no artifact {name}"})
        start_response(
            "200 OK",
            [
                ("Content-Type", "application/octet-stream"),
                ("Content-Length", str(len(data))),
                ("Content-Disposition", f'attachment; filename="{name}"'),
            ],
        )
        return [data]


_REASONS = {
    200: "OK",
    202: "Accepted",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
}


def _json(start_response: StartResponse, status: int, body: Any) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(
        f"{status} {_REASONS[status]}", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]
