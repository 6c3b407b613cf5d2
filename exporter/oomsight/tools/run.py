"""Local mode: ``oomsight run -- python train.py`` with no Kubernetes and no Prometheus.

Runs the command with the hook loaded through the startup folder (no edit of the
script), serves ``/metrics`` on localhost while it runs, preserves its exit code
and prints the memory report to stderr when it ends. The temporary folders it made
are removed at the end; a spool given with ``--spool`` stays, and so does a temporary
spool that holds memory snapshots or profiler traces (it says where).

SIGTERM and SIGHUP are passed to the command, and so is a SIGINT that the terminal did not
also send it (``kill -INT PID``); oomsight then exits 130 after the report (``docs/cli.md``).

There is no admin endpoint here: ``oomsight profile --spool SPOOL`` writes the same
request into the spool that the sidecar's admin endpoint would. Two runs at once
work: without ``--port`` a busy 21400 makes the second pick a free port.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
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
from oomsight.tools import exitcode, report, tape
from oomsight.wire.spool import ARTIFACTS, SpoolReader

DEFAULT_PORT = 21400
"""Outside the crowded 9100-9999 exporter range (9400 is dcgm-exporter's)."""
WATCH_SECONDS = 1.0
"""How often the spool is looked at for the first process with a CUDA device."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    command: list[str]
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    spool_dir: Optional[str] = None
    report: bool = True
    tape: Optional[str] = None
    """Also record every spool document into this tape file (``oomsight replay`` plays it)."""
    port_fallback: bool = False
    """When ``port`` is busy, serve on a free port instead of refusing to start (no ``--port`` given)."""


class PortBusy(OSError):
    """The metrics port asked for is in use."""


def run(opts: RunOptions, out: TextIO = sys.stderr) -> int:
    """Run the command under oomsight; return its exit code (128+N if killed by signal N, 130
    when oomsight itself was interrupted). A temporary spool goes at the end, whatever ended it."""
    spool = opts.spool_dir or tempfile.mkdtemp(prefix="oomsight-run-")
    try:
        return _run_in(spool, opts, out)
    finally:
        if opts.spool_dir is None and os.path.isdir(spool):
            _tidy_spool(spool, out)


def _run_in(spool: str, opts: RunOptions, out: TextIO) -> int:
    os.makedirs(spool, exist_ok=True)
    collector = SpoolCollector(spool)
    registry = CollectorRegistry()
    registry.register(collector)
    out.write(f"oomsight: spool {spool}\n")
    try:
        server = _serve(opts, registry, out)
    except PortBusy as exc:
        out.write(f"oomsight run: {exc}\n")
        _remove_ours(spool if opts.spool_dir is None else None)
        return exitcode.PORT_BUSY
    try:
        recorder = TapeRecorder(opts.tape, spool, out, opts.command) if opts.tape else None
    except OSError as exc:  # a folder, a read-only place: said before the command runs
        out.write(f"oomsight run: cannot write the tape {opts.tape}: {exc.strerror or exc}\n")
        _stop_server(server)
        _remove_ours(spool if opts.spool_dir is None else None)
        return exitcode.REFUSED
    boot = tempfile.mkdtemp(prefix="oomsight-startup-")
    workers: list[Worker] = []
    try:
        startup.install(boot)
        env = dict(os.environ)
        env[ENV_DIR] = spool
        env["PYTHONPATH"] = startup.pythonpath_with(boot, env.get("PYTHONPATH"))
        workers += [recorder.start() if recorder else _idle(), _start_watch(spool, out)]
        code = _run_child(opts.command, env, out)
    finally:
        for stop, thread in workers:
            stop.set()
            thread.join()
        _stop_server(server)
        _remove_ours(boot)
    if opts.report:
        out.write(report.render(collector.inventory(), spool))
    if recorder is not None and recorder.failed and code == exitcode.OK:
        return exitcode.REFUSED  # the command succeeded, the tape asked for was not written whole
    return code


def _stop_server(server: Any) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


Worker = tuple[threading.Event, threading.Thread]


class TapeRecorder:
    """``--tape``: the file opened at once (a folder or a read-only place is refused before the command
    runs), written by a thread; a write that fails later (a full disk) is said in one line and the tape
    stops there, and ``oomsight run`` then exits 1 where its command exited 0 (``exitcode.REFUSED``)."""

    def __init__(self, path: str, spool: str, out: TextIO, command: list[str]) -> None:
        self.path, self.spool, self.out, self.command = path, spool, out, command
        self.file = open(path, "wb")  # noqa: SIM115 (closed by the recording thread)
        self.failed = False

    def start(self) -> Worker:
        stop = threading.Event()
        thread = threading.Thread(target=self._record, args=(stop,), name="oomsight-tape", daemon=True)
        thread.start()
        return stop, thread

    def _record(self, stop: threading.Event) -> None:
        try:
            with self.file:
                tape.record(self.spool, self.file, stop, meta={"command": self.command})
        except (OSError, ValueError) as exc:
            self.failed = True
            reason = getattr(exc, "strerror", None) or exc
            _say(self.out, f"oomsight run: cannot write the tape {self.path}: {reason}; it stops here\n")


def _idle() -> Worker:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    return threading.Event(), thread


def _start_watch(spool: str, out: TextIO) -> Worker:
    stop = threading.Event()
    thread = threading.Thread(target=announce_profiling, args=(spool, out, stop), daemon=True)
    thread.start()
    return stop, thread


def announce_profiling(spool: str, out: TextIO, stop: threading.Event, interval: float = WATCH_SECONDS) -> bool:
    """Say how to profile once a process of the spool uses a CUDA device (never on a
    machine without one); True when it was said."""
    reader = SpoolReader(spool)
    while True:
        devices = [d for s in reader.read().snapshots for d in s["devices"]]
        if devices:
            out.write(f"oomsight: profile the running job with: oomsight profile --spool {spool} --steps 5 --wait 60\n")
            out.flush()
            return True
        if stop.wait(interval):
            return False


def _serve(opts: RunOptions, registry: CollectorRegistry, out: TextIO) -> Any:
    try:
        server = _listen(opts.host, opts.port, registry)
    except OSError as exc:
        if not _busy(exc):
            reason = exc.strerror or exc  # no "[Errno N]"
            out.write(f"oomsight: cannot serve /metrics on {opts.host}:{opts.port} ({reason}); running without it\n")
            return None
        if not opts.port_fallback:
            busy = f"port {opts.port} on {opts.host} is in use; choose another with --port N (0 picks one)"
            raise PortBusy(busy) from exc
        server = _listen(opts.host, 0, registry)
        out.write(f"oomsight: port {opts.port} is in use (another oomsight run?); serving on a free port instead\n")
    out.write(f"oomsight: metrics at http://{opts.host}:{server.server_port}/metrics\n")
    out.flush()
    return server


def _listen(host: str, port: int, registry: CollectorRegistry) -> Any:
    started: Any = start_http_server(port, addr=host, registry=registry)
    return started[0] if isinstance(started, tuple) else started


def _busy(exc: OSError) -> bool:
    import errno

    return exc.errno in (errno.EADDRINUSE, errno.EACCES)


def _tidy_spool(spool: str, out: TextIO) -> None:
    """Remove the temporary spool unless it holds files worth keeping (memory snapshots, traces)."""
    try:
        kept = [n for n in os.listdir(os.path.join(spool, ARTIFACTS)) if not n.startswith(".")]
    except OSError:
        kept = []
    if kept:
        _say(
            out,
            f"oomsight: kept {spool}: it holds {len(kept)} artifact(s) (memory snapshots, profiles); "
            f"oomsight report {spool} shows it again\n",
        )
        return
    _remove_ours(spool)
    _say(out, f"oomsight: removed the temporary spool {spool} (--spool DIR keeps one)\n")


def _say(out: TextIO, text: str) -> None:
    """A last notice; a closed stream (its reader went away) must not stop the tidying."""
    try:
        out.write(text)
        out.flush()
    except (OSError, ValueError):
        pass


def _remove_ours(folder: Optional[str]) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)  # symlinks inside are removed, never followed


def _run_child(command: list[str], env: dict[str, str], out: TextIO) -> int:
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        out.write(f"oomsight run: cannot start {command[0]!r}: {exc.strerror or exc}\n")
        return exitcode.CANNOT_START
    interrupted = threading.Event()

    def forward(sig: int, _frame: Any) -> None:
        if sig == signal.SIGINT:
            interrupted.set()
            if _in_terminal_foreground():
                return  # a Ctrl-C: the terminal sent it to the child as well
        child.send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    code = rc if rc >= 0 else 128 - rc
    if interrupted.is_set():
        out.write(f"oomsight run: interrupted (SIGINT); the command exited with {code}\n")
        return exitcode.INTERRUPTED
    return code


def _in_terminal_foreground() -> bool:
    """Whether this process belongs to its terminal's foreground process group: a SIGINT then
    comes from a Ctrl-C, which the terminal sends to the whole group, the command included.
    Otherwise (``kill -INT PID``, a CI runner, ``timeout -s INT``) only oomsight got it."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def missing_script(command: list[str]) -> Optional[str]:
    """The script of ``python SCRIPT ...`` when it does not exist (python would say so only
    after oomsight had set everything up, and the report would blame CUDA)."""
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    for arg in command[1:]:
        if arg in ("-m", "-c", "-"):
            return None
        if arg.startswith("-"):
            continue
        return arg if arg.endswith(".py") and not os.path.exists(arg) else None
    return None


def unstartable(command: list[str]) -> Optional[str]:
    """Why ``command`` cannot be started, in the shell's words, else None: checked before the spool, the
    server and the report are set up around a command that would never run (its one error said alone)."""
    name = command[0] if command else ""
    if os.sep not in name:
        return None if shutil.which(name) else "command not found"
    if not os.path.exists(name):
        return "No such file or directory"
    if os.path.isdir(name) or not os.access(name, os.X_OK):
        return "Permission denied"
    return None
