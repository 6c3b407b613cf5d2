"""Real programs for tests: the sidecar as a subprocess, a real Prometheus server."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Callable, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_this_machine_gives(seconds: float) -> float:
    """``seconds`` of an unshared machine as this one gives them now: scaled up by its run queue per CPU
    (the 1-minute load average over the CPUs) where other work oversubscribes it, else as they are. A test
    that has a real server answer "within a second" keeps that claim on an idle machine and does not fail
    on a CI machine whose two cores five jobs share (issue 50: no test depends on a loaded machine's clock)."""
    try:
        queued = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system: an unshared machine's seconds
        queued = 1.0
    return seconds * max(1.0, queued)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout} s")


@contextmanager
def sidecar(
    spool: str, *extra: str, env: Optional[dict[str, str]] = None
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oomsight",
            "sidecar",
            "--spool",
            spool,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextmanager
def prometheus(
    workdir: str,
    targets: list[str],
    rule_files: Optional[list[str]] = None,
    scrape_interval: str = "1s",
    scrape_configs: Optional[list[dict[str, Any]]] = None,
) -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (host:port) with pod-like target labels,
    or the given ``scrape_configs``."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: run scripts/install-tools.sh"
    port = free_port()
    default = {
        "job_name": "oomsight",
        "static_configs": [
            {"targets": [t], "labels": {"namespace": "team-a", "pod": f"train-{i}", "container": "oomsight"}}
            for i, t in enumerate(targets)
        ],
    }
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": rule_files or [],
        "scrape_configs": scrape_configs or [default],
    }
    cfg = os.path.join(workdir, "prometheus.yml")
    with open(cfg, "w") as fh:
        json.dump(config, fh)  # JSON is YAML
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(f"{url}/-/ready")[0] == 200, timeout=30)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def promql(url: str, expr: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    doc = json.loads(body)
    assert status == 200 and doc["status"] == "success", f"{expr}: {body}"
    return list(doc["data"]["result"])


def promql_at(url: str, expr: str, at: float) -> list[dict[str, Any]]:
    """An instant query evaluated at Unix time ``at``."""
    status, body = http_get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}))
    doc = json.loads(body)
    assert status == 200 and doc["status"] == "success", f"{expr}: {body}"
    return list(doc["data"]["result"])


def promql_range(url: str, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
    """A range query, as Grafana runs a time-series panel."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    status, body = http_get(f"{url}/api/v1/query_range?" + urllib.parse.urlencode(params))
    doc = json.loads(body)
    assert status == 200 and doc["status"] == "success", f"{expr}: {body}"
    return list(doc["data"]["result"])


def owner_exposition(name: str, kind: str = "Job") -> bytes:
    """The pod-owner info series as the sidecar publishes it (namespace/pod come from the target)."""
    return (
        "# HELP oomsight_pod_owner_info The pod's controller.\n# TYPE oomsight_pod_owner_info gauge\n"
        f'oomsight_pod_owner_info{{owner_kind="{kind}",owner_name="{name}"}} 1\n'
    ).encode()


@contextmanager
def exposition_server(body: Callable[[str], bytes]) -> Iterator[int]:
    """A static text-exposition server: ``body(path)`` is served at every path; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = body(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
