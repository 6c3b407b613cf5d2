"""The sidecar's admin endpoint: ask for a profiling window, list profiles, download
artifacts (memory snapshots, profiler tables and traces).

Bound to 127.0.0.1 by default — reach it with ``kubectl port-forward pod/<pod> 21401``.
Listening on any other address requires a bearer token (``OOMSIGHT_ADMIN_TOKEN`` or
``OOMSIGHT_ADMIN_TOKEN_FILE``); with a token set, every request must carry it. In a
``hostNetwork`` pod (loopback is the node's) the webhook sets
``OOMSIGHT_ADMIN_REQUIRE_TOKEN=1`` and ``OOMSIGHT_ADMIN_PORT=auto``: a token is made and
written to the token file, and the port picked is logged (docs/profiling.md).

Artifacts are served only as regular files directly in the spool's ``artifacts``
folder, never through a symbolic link, and streamed in 64 KiB chunks.
"""

from __future__ import annotations

import dataclasses
import errno
import hmac
import json
import os
import re
import secrets
import stat
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional

from oomsight.analysis.profile_plan import submit
from oomsight.config import ConfigError
from oomsight.wire.spool import ARTIFACTS, SpoolReader
from oomsight_sidecar.settings import ENV_ADMIN_TOKEN_FILE, AdminSettings

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
CHUNK_BYTES = 64 * 1024
StartResponse = Callable[..., Any]


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
        fd = open_artifact(self.spool_dir, name)
        if fd is None:
            return _json(start_response, 404, {"error": f"no artifact {name}"})
        size = os.fstat(fd).st_size
        start_response(
            "200 OK",
            [
                ("Content-Type", "application/octet-stream"),
                ("Content-Length", str(size)),
                ("Content-Disposition", f'attachment; filename="{name}"'),
            ],
        )
        return _chunks(fd, size)


def open_artifact(spool_dir: str, name: str) -> Optional[int]:
    """A read-only descriptor of the regular file ``name`` directly in the spool's artifacts
    folder, or None: no symbolic link is followed (``O_NOFOLLOW``), the folder itself must
    resolve to the spool's own ``artifacts`` (a link there to elsewhere is refused), and a file
    with more than one name is refused (a hard link can name a file outside the spool on the
    same filesystem; the hook writes each artifact once, under one name)."""
    folder = os.path.join(spool_dir, ARTIFACTS)
    if os.path.realpath(folder) != os.path.join(os.path.realpath(spool_dir), ARTIFACTS):
        return None
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # missing, a symbolic link (ELOOP), or unreadable
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)  # a FIFO, device or folder by that name; or a hard link, maybe to a file outside the spool
        return None
    return fd


def _chunks(fd: int, size: int) -> Iterator[bytes]:
    """At most ``size`` bytes of ``fd`` in chunks of ``CHUNK_BYTES``; closes ``fd``."""
    try:
        left = size
        while left > 0:
            data = os.read(fd, min(CHUNK_BYTES, left))
            if not data:
                return  # the file shrank; the client sees a short body
            left -= len(data)
            yield data
    finally:
        os.close(fd)


def ensure_token(settings: AdminSettings) -> AdminSettings:
    """With ``require_token`` and no token yet: make one and write it to ``token_file`` (0600)."""
    if settings.token or not settings.require_token or not settings.port:
        return settings
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(settings.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise ConfigError(f"{ENV_ADMIN_TOKEN_FILE}: cannot write {settings.token_file} ({exc})") from None
        with open(settings.token_file, encoding="utf-8") as fh:  # made in the meantime (a restart)
            return dataclasses.replace(settings, token=fh.read().strip() or None)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return dataclasses.replace(settings, token=token)


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
