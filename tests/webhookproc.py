"""The webhook as a real ``oomsight webhook`` subprocess over TLS on loopback, and clients
that attack a server's connections: for tests/test_connection_attacks.py and
benchmarks/bench_webhook_memory.py. Every loop here is bounded in count and in time."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import resource
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional

from oomsight_webhook.certs import make_ca, make_serving

from procs import free_port, http_get, wait_for

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def review(pod: dict[str, Any]) -> bytes:
    """An AdmissionReview for a pod CREATE, as the API server writes it."""
    request = {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": pod,
    }
    return json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request}).encode()


def status_kib(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of a process, in KiB."""
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def raise_descriptor_limit(wanted: int) -> None:
    """The test process's soft ``RLIMIT_NOFILE`` raised to ``wanted`` (within the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard)
        )


class WebhookProcess:
    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, metrics_port: int, ca_pem: bytes) -> None:
        self.proc, self.host, self.port, self.metrics_port = proc, host, port, metrics_port
        self.client_context = ssl.create_default_context(cadata=ca_pem.decode())

    def connection(self, timeout: float = 10.0) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection("localhost", self.port, context=self.client_context, timeout=timeout)
        conn.sock = self.client_context.wrap_socket(
            socket.create_connection((self.host, self.port), timeout=timeout), server_hostname="localhost"
        )
        return conn

    def post(self, body: bytes, conn: Optional[http.client.HTTPSConnection] = None) -> tuple[int, bytes]:
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            if own:
                conn.close()

    def counter(self, series: str) -> float:
        text = http_get(f"http://{self.host}:{self.metrics_port}/metrics")[1]
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(series + " ")))


@contextlib.contextmanager
def webhook_process(
    folder: str, host: str = "127.0.0.1", env: Optional[dict[str, str]] = None
) -> Iterator[WebhookProcess]:
    """``oomsight webhook`` in ``files`` TLS mode with a certificate made here, until SIGTERM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = make_ca("attack-ca", now)
    serving = make_serving(ca, ["oomsight-webhook.oomsight.svc", "localhost"], now)
    cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
    with open(cert, "wb") as fh:
        fh.write(serving.cert_pem)
    with open(key, "wb") as fh:
        fh.write(serving.key_pem)
    log = open(os.path.join(folder, "webhook.log"), "wb")  # noqa: SIM115 - a file, never a pipe that fills; closed below
    proc = None
    try:
        for _attempt in range(3):  # a free port can be taken by another test's client before the webhook binds it
            port, metrics_port = free_port(), free_port()
            env_now = {
                **os.environ,
                "OOMSIGHT_WEBHOOK_HOST": host,
                "OOMSIGHT_WEBHOOK_PORT": str(port),
                "OOMSIGHT_WEBHOOK_METRICS_PORT": str(metrics_port),
                "OOMSIGHT_WEBHOOK_TLS_MODE": "files",
                "OOMSIGHT_WEBHOOK_CERT_FILE": cert,
                "OOMSIGHT_WEBHOOK_KEY_FILE": key,
                "OOMSIGHT_WEBHOOK_CERT_DIR": os.path.join(folder, "loaded"),
                "OOMSIGHT_INJECT_IMAGE": "ghcr.io/oomsight/oomsight:0.1.0",
                "OOMSIGHT_INJECT_NATIVE_SIDECAR": "true",
                **(env or {}),
            }
            proc = subprocess.Popen([sys.executable, "-m", "oomsight", "webhook"], env=env_now, stdout=log, stderr=log)
            url = f"http://{host}:{metrics_port}/metrics"
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: proc.poll() is not None or http_get(url)[0] == 200, timeout=30)  # noqa: B023
            if proc.poll() is None:
                break
        if proc.poll() is not None or http_get(url)[0] != 200:
            log.flush()
            with open(log.name, "rb") as fh:
                raise AssertionError(f"the webhook did not start: {fh.read()[-2000:]!r}")
        yield WebhookProcess(proc, host, port, metrics_port, ca.cert_pem)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


class Attack:
    """Up to ``connections`` sockets to ``(host, port)`` from ``source`` (another loopback
    address than the probes', as another pod would be) held open by one thread: ``silent``
    ones send nothing; ``slow`` ones send a request head a byte at a time, one byte per
    connection every ``trickle_seconds``; ``slow-body`` ones (with ``tls``) send a whole
    ``POST /mutate`` head announcing 800,000 bytes, then trickle the body. A connection the
    server closes is opened again, so the pressure stays; everything stops after ``seconds``
    or at :meth:`stop`."""

    def __init__(
        self,
        host: str,
        port: int,
        connections: int,
        mode: str = "silent",
        seconds: float = 20.0,
        trickle_seconds: float = 0.5,
        source: str = "127.0.0.2",
        tls: Optional[ssl.SSLContext] = None,
    ) -> None:
        self.address, self.connections, self.mode, self.source = (host, port), connections, mode, source
        self.seconds, self.trickle_seconds, self.tls = seconds, trickle_seconds, tls
        self.opened = self.reopened = self.peak_open = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    REOPEN_PER_TURN = 10
    """Reconnections per 50 ms turn (200 a second): pressure enough to keep the server over its
    cap, without cycling through the machine's ephemeral ports (TIME_WAIT)."""
    HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
    BODY_HEAD = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 800000\r\n\r\n"
    """``slow-body``: this head at once, then the body a byte at a time."""

    def __enter__(self) -> Attack:
        self._thread.start()
        self._ready.wait(self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _connect(self, sel: selectors.BaseSelector) -> bool:
        """A non-blocking connect: a server whose backlog is full never stalls the attack.
        With ``tls``, a whole TLS handshake first (blocking, 2 s at most), then the same."""
        if self.tls is not None:
            return self._connect_tls(sel)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return False
        sock.setblocking(False)
        try:
            sock.bind((self.source, 0))
        except OSError:
            sock.close()
            return False
        sock.connect_ex(self.address)  # EINPROGRESS; a refusal shows as readable with an error
        sel.register(sock, selectors.EVENT_READ, [0])  # data: how many head bytes were sent
        self.opened += 1
        return True

    def _connect_tls(self, sel: selectors.BaseSelector) -> bool:
        try:
            raw = socket.create_connection(self.address, timeout=2, source_address=(self.source, 0))
            sock = self.tls.wrap_socket(raw, server_hostname="localhost")  # type: ignore[union-attr]
        except OSError:
            return False
        if self.mode == "slow-body":
            with contextlib.suppress(OSError):
                sock.sendall(self.BODY_HEAD)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, [0])
        self.opened += 1
        return True

    def _closed(self, sock: Any) -> bool:
        """Readable: closed by the server (or answered); a TLS session ticket is neither."""
        try:
            return not sock.recv(65536) or True
        except (ssl.SSLWantReadError, BlockingIOError):
            return False
        except OSError:
            return True

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        end = time.monotonic() + self.seconds
        try:
            while len(sel.get_map()) < self.connections and time.monotonic() < end and not self._stop.is_set():
                if not self._connect(sel):
                    break
            self._ready.set()
            next_trickle = time.monotonic()
            while time.monotonic() < end and not self._stop.is_set():
                for key, _ in sel.select(0.05):  # readable: the server answered or closed
                    if self._closed(key.fileobj):
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                missing = self.connections - len(sel.get_map())
                for _ in range(min(missing, self.REOPEN_PER_TURN)):  # bounded: loopback's ports are shared
                    self.reopened += self._connect(sel)
                self.peak_open = max(self.peak_open, len(sel.get_map()))
                if self.mode in ("slow", "slow-body") and time.monotonic() >= next_trickle:
                    next_trickle = time.monotonic() + self.trickle_seconds
                    self._trickle(sel)
        finally:
            self._ready.set()
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()

    def _trickle(self, sel: selectors.BaseSelector) -> None:
        for key in list(sel.get_map().values()):
            sent = key.data
            byte = b" " if self.mode == "slow-body" else self.HEAD[sent[0] : sent[0] + 1]
            if byte:
                with contextlib.suppress(OSError):
                    sent[0] += key.fileobj.send(byte)  # type: ignore[union-attr]


def timed(call: Any) -> tuple[float, Any]:
    """``(seconds, result)`` of ``call()``; an exception is the result."""
    start = time.monotonic()
    try:
        result = call()
    except Exception as exc:  # a probe's failure is data here
        result = exc
    return time.monotonic() - start, result
