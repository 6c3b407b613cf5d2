"""Local mode: ``oomsight run -- python train.py`` with no Kubernetes and no Prometheus.

Runs the command with the hook loaded through the startup folder (no edit of the
script), serves ``/metrics`` on localhost while it runs, preserves its exit code
and prints the memory report to stderr when it ends.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Optional, TextIO

from prometheus_client import CollectorRegistry, start_http_server

from oomsight.config import ENV_DIR
from oomsight.hook import startup
from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import report, tape

DEFAULT_PORT = 21400
"""Outside the crowded 9100-9999 exporter range (9400 is dcgm-exporter's)."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    command: list[str]
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    spool_dir: Optional[str] = None
    report: bool = True
    tape: Optional[str] = None
    """Also record every spool document into this tape file (``oomsight replay`` plays it)."""


def run(opts: RunOptions, out: TextIO = sys.stderr) -> int:
    """Run the command under oomsight; return its exit code (128+N if killed by signal N)."""
    spool = opts.spool_dir or tempfile.mkdtemp(prefix="oomsight-run-")
    os.makedirs(spool, exist_ok=True)
    boot = startup.install(tempfile.mkdtemp(prefix="oomsight-startup-"))
    env = dict(os.environ)
    env[ENV_DIR] = spool
    env["PYTHONPATH"] = startup.pythonpath_with(boot, env.get("PYTHONPATH"))
    collector = SpoolCollector(spool)
    registry = CollectorRegistry()
    registry.register(collector)
    out.write(f"oomsight: spool {spool} (profile it: oomsight profile --spool {spool} --steps 5)\n")
    server = _serve(opts, registry, out)
    recorder = _start_tape(opts, spool)
    try:
        code = _run_child(opts.command, env, out)
    finally:
        if recorder is not None:
            recorder[0].set()
            recorder[1].join()
        if server is not None:
            server.shutdown()
    if opts.report:
        out.write(report.render(collector.inventory(), spool))
    return code


def _start_tape(opts: RunOptions, spool: str) -> Optional[tuple[threading.Event, threading.Thread]]:
    if not opts.tape:
        return None
    stop = threading.Event()
    meta = {"command": opts.command}
    thread = threading.Thread(target=tape.record, args=(spool, opts.tape, stop), kwargs={"meta": meta}, daemon=True)
    thread.start()
    return stop, thread


def _serve(opts: RunOptions, registry: CollectorRegistry, out: TextIO) -> Any:
    try:
        started = start_http_server(opts.port, addr=opts.host, registry=registry)
    except OSError as exc:
        out.write(f"oomsight: cannot serve /metrics on {opts.host}:{opts.port} ({exc}); running without it\n")
        return None
    server = started[0] if isinstance(started, tuple) else None
    port = server.server_port if server is not None else opts.port
    out.write(f"oomsight: metrics at http://{opts.host}:{port}/metrics\n")
    out.flush()
    return server


def _run_child(command: list[str], env: dict[str, str], out: TextIO) -> int:
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        out.write(f"oomsight: cannot start {command[0]!r}: {exc}\n")
        return 127
    forwarded = (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda sig, _frame: child.send_signal(sig)) for s in forwarded}
    # Ctrl-C reaches the child from the terminal directly; the parent just waits for it.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return rc if rc >= 0 else 128 - rc
