"""Every exit code that ``docs/cli.md`` gives a subcommand, made to happen by running that
subcommand as a user would; a code documented without a way to cause it, or a way found
for a code the page does not list, fails. So the page and the program cannot drift apart."""

from __future__ import annotations

import os
import re
import signal
import socket
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest

from oomsight.tools import exitcode

from clirun import (
    PEEKS,
    PY,
    Result,
    env_with_tmp,
    left_in,
    oomsight,
    said_well,
    started,
    wait_for_line,
    with_stdout_closed,
)
from spoolmaker import hooked_process

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
SECTION = re.compile(r"^## `oomsight ([a-z-]+)")
CODES = re.compile(r"^(?:`oomsight ([a-z-]+)` )?[Ee]xit codes: (.+)$")


def documented() -> dict[str, set[int]]:
    """``{subcommand: codes}`` from the "Exit codes:" line of each subcommand's section."""
    found: dict[str, set[int]] = {}
    section = None
    for line in DOC.read_text().splitlines():
        head = SECTION.match(line)
        if head:
            section = head.group(1)
        codes = CODES.match(line)
        if codes:
            name = codes.group(1) or section
            assert name, line
            found[name] = {int(n) for n in re.findall(r"\b\d+\b", codes.group(2))}
    return found


def script(tmp: Path, body: str, name: str = "train.py") -> str:
    path = tmp / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def interrupted(*args: str, tmp: Path, ready: tuple[str, str]) -> Result:
    """``oomsight ARGS`` sent SIGINT (``kill -INT PID``) once ``ready`` = (stream, text) is seen."""
    proc = started(*args, tmp=str(tmp))
    wait_for_line(proc, *ready)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    said_well(err)
    return Result(proc.returncode, out, err, left_in(str(tmp)))


# -- run ----------------------------------------------------------------------------------------


def run_ok(tmp: Path) -> Result:
    return oomsight("run", "--port", "0", "--no-report", "--", PY, "-c", "pass", tmp=str(tmp))


def run_usage(tmp: Path) -> Result:
    return oomsight("run", "--port", "99999", "--", PY, "-c", "pass", tmp=str(tmp))


def run_port_busy(tmp: Path) -> Result:
    with busy_port() as sock:
        return oomsight("run", "--port", str(sock.getsockname()[1]), "--", PY, "-c", "pass", tmp=str(tmp))


def run_cannot_start(tmp: Path) -> Result:
    return oomsight("run", "--port", "0", "--", str(tmp / "no-such-program"), tmp=str(tmp))


def run_interrupted(tmp: Path) -> Result:
    child = script(
        tmp,
        """
        import sys, time
        try:  # "started" inside the try: a SIGINT that lands right after the line is still caught
            print("started", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            sys.exit(130)
        """,
    )
    return interrupted("run", "--port", "0", "--", PY, child, tmp=tmp, ready=("stdout", "started"))


def run_pipe_closed(tmp: Path) -> Result:
    return with_stdout_closed("run", "--port", "0", "--", PY, "-c", "pass", tmp=str(tmp), stream="stderr")


# -- report, profile, replay --------------------------------------------------------------------


def a_spool(tmp: Path) -> str:
    spool = tmp / "spool"
    spool.mkdir(exist_ok=True)
    return str(spool)


def report_ok(tmp: Path) -> Result:
    return oomsight("report", a_spool(tmp), tmp=str(tmp))


def report_refused(tmp: Path) -> Result:
    return oomsight("report", "--html", "/proc/nope/r.html", a_spool(tmp), tmp=str(tmp))


def report_usage(tmp: Path) -> Result:
    return oomsight("report", "--retention-seconds", "-5", a_spool(tmp), tmp=str(tmp))


def report_pipe_closed(tmp: Path) -> Result:
    return with_stdout_closed("report", a_spool(tmp), tmp=str(tmp))


def live_spool(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A spool with one live process (this test's own, hooked over fakes)."""
    spool = str(tmp / "live")
    hooked_process(spool, monkeypatch=monkeypatch)
    return spool


def profile_ok(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    return oomsight("profile", "--spool", live_spool(tmp, monkeypatch), tmp=str(tmp))


def profile_refused(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    spool = live_spool(tmp, monkeypatch)
    assert oomsight("profile", "--spool", spool, tmp=str(tmp)).returncode == 0
    return oomsight("profile", "--spool", spool, tmp=str(tmp))  # a window is already pending


def profile_usage(tmp: Path) -> Result:
    return oomsight("profile", "--spool", str(tmp / "none"), tmp=str(tmp))


def profile_timed_out(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Result:
    return oomsight("profile", "--spool", live_spool(tmp, monkeypatch), "--wait", "0.3", tmp=str(tmp))


TAPE = str(Path(__file__).resolve().parent.parent / "exporter/oomsight/tools/data/h200-demo.tape.jsonl.gz")


def replay_ok(tmp: Path) -> Result:
    return oomsight("replay", TAPE, "--spool", str(tmp / "replayed"), "--speed", "1000", tmp=str(tmp))


def replay_refused(tmp: Path) -> Result:
    (tmp / "ro").mkdir()
    (tmp / "ro").chmod(0o500)
    if os.access(tmp / "ro", os.W_OK):  # root writes anywhere: a path under a file fails for everyone
        (tmp / "file").write_text("")
        return oomsight("replay", TAPE, "--spool", str(tmp / "file" / "spool"), tmp=str(tmp))
    return oomsight("replay", TAPE, "--spool", str(tmp / "ro" / "spool"), tmp=str(tmp))


def replay_usage(tmp: Path) -> Result:
    (tmp / "file").write_text("")
    return oomsight("replay", TAPE, "--spool", str(tmp / "file"), tmp=str(tmp))


def replay_interrupted(tmp: Path) -> Result:
    spool = tmp / "slow"
    proc = started("replay", TAPE, "--spool", str(spool), "--speed", "0.5", tmp=str(tmp))
    deadline = time.monotonic() + 60
    while not (spool / "snapshots").is_dir() and time.monotonic() < deadline:  # it has begun writing
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    said_well(err)
    return Result(proc.returncode, out, err, left_in(str(tmp)))


# -- predict, demo, install-startup --------------------------------------------------------------


def predict_ok(tmp: Path) -> Result:
    return oomsight("predict", "--list", tmp=str(tmp))


def predict_refused(tmp: Path) -> Result:
    model = script(tmp, PEEKS, "peeks.py")
    return oomsight("predict", "--module", f"{model}:spec", "--batch", "2", "--steps", "1", tmp=str(tmp))


def predict_usage(tmp: Path) -> Result:
    return oomsight("predict", "--model", "gpt2", "--capacity", "40Gb", tmp=str(tmp))


def predict_pipe_closed(tmp: Path) -> Result:
    return with_stdout_closed("predict", "--list", tmp=str(tmp))


def demo_ok(tmp: Path) -> Result:
    return oomsight("demo", "--speed", "400", tmp=str(tmp))


def demo_interrupted(tmp: Path) -> Result:
    return interrupted("demo", "--speed", "0.5", tmp=tmp, ready=("stdout", "serving the replayed spool"))


def demo_pipe_closed(tmp: Path) -> Result:
    return with_stdout_closed("demo", "--speed", "400", tmp=str(tmp))


def install_ok(tmp: Path) -> Result:
    return oomsight("install-startup", str(tmp / "startup"), tmp=str(tmp))


def install_refused(tmp: Path) -> Result:
    (tmp / "file").write_text("")
    return oomsight("install-startup", str(tmp / "file" / "startup"), tmp=str(tmp))


def install_usage(tmp: Path) -> Result:
    (tmp / "file").write_text("")
    return oomsight("install-startup", str(tmp / "file"), tmp=str(tmp))


# -- sidecar, webhook ------------------------------------------------------------------------------


def sidecar_ok(tmp: Path) -> Result:
    proc = started("sidecar", "--spool", a_spool(tmp), "--port", "0", tmp=str(tmp))
    wait_for_line(proc, "stderr", "/metrics")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return Result(proc.returncode, out, err, left_in(str(tmp)))


def sidecar_usage(tmp: Path) -> Result:
    env = env_with_tmp(str(tmp), OOMSIGHT_SIDECAR_PORT="70000")
    return oomsight("sidecar", "--spool", a_spool(tmp), tmp=str(tmp), env=env)


def sidecar_port_busy(tmp: Path) -> Result:
    env = env_with_tmp(str(tmp), OOMSIGHT_ADMIN_PORT="0")
    with busy_port() as sock:
        port = str(sock.getsockname()[1])
        return oomsight("sidecar", "--spool", a_spool(tmp), "--port", port, tmp=str(tmp), env=env)


def webhook_env(tmp: Path) -> dict[str, str]:
    import datetime

    from oomsight_webhook.certs import make_ca, make_serving

    now = datetime.datetime.now(datetime.timezone.utc)
    serving = make_serving(make_ca("walk-ca", now), ["localhost"], now)
    (tmp / "tls.crt").write_bytes(serving.cert_pem)
    (tmp / "tls.key").write_bytes(serving.key_pem)
    return env_with_tmp(
        str(tmp),
        OOMSIGHT_WEBHOOK_CERT_FILE=str(tmp / "tls.crt"),
        OOMSIGHT_WEBHOOK_KEY_FILE=str(tmp / "tls.key"),
        OOMSIGHT_WEBHOOK_CERT_DIR=str(tmp / "loaded"),
        OOMSIGHT_WEBHOOK_METRICS_PORT="0",
        OOMSIGHT_INJECT_IMAGE="ghcr.io/oomsight/oomsight:0.1.0",
    )


def webhook_ok(tmp: Path) -> Result:
    proc = started("webhook", "--tls-mode", "files", "--port", "0", tmp=str(tmp), env=webhook_env(tmp))
    wait_for_line(proc, "stderr", "/mutate")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return Result(proc.returncode, out, err, left_in(str(tmp)))


def webhook_port_busy(tmp: Path) -> Result:
    with busy_port() as sock:
        port = str(sock.getsockname()[1])
        result = oomsight("webhook", "--tls-mode", "files", "--port", port, tmp=str(tmp), env=webhook_env(tmp))
    assert f"port {port} on " in result.stderr, result.stderr  # the busy port is named
    return result


def webhook_usage(tmp: Path) -> Result:
    env = {k: v for k, v in webhook_env(tmp).items() if k != "OOMSIGHT_INJECT_IMAGE"}
    return oomsight("webhook", "--tls-mode", "files", "--port", "0", tmp=str(tmp), env=env)


def recommend_ok(tmp: Path) -> Result:
    from procs import exposition_server

    empty = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
    with exposition_server(lambda path: empty) as port:
        return oomsight("recommend", "--prometheus", f"http://127.0.0.1:{port}", tmp=str(tmp))


def recommend_usage(tmp: Path) -> Result:
    return oomsight("recommend", "--prometheus", "http://127.0.0.1:1", tmp=str(tmp))


WAYS: dict[tuple[str, int], Callable[..., Result]] = {
    ("run", 0): run_ok,
    ("run", 2): run_usage,
    ("run", 4): run_port_busy,
    ("run", 127): run_cannot_start,
    ("run", 130): run_interrupted,
    ("run", 141): run_pipe_closed,
    ("report", 0): report_ok,
    ("report", 1): report_refused,
    ("report", 2): report_usage,
    ("report", 141): report_pipe_closed,
    ("profile", 0): profile_ok,
    ("profile", 1): profile_refused,
    ("profile", 2): profile_usage,
    ("profile", 3): profile_timed_out,
    ("replay", 0): replay_ok,
    ("replay", 1): replay_refused,
    ("replay", 2): replay_usage,
    ("replay", 130): replay_interrupted,
    ("predict", 0): predict_ok,
    ("predict", 1): predict_refused,
    ("predict", 2): predict_usage,
    ("predict", 141): predict_pipe_closed,
    ("recommend", 0): recommend_ok,
    ("recommend", 2): recommend_usage,
    ("demo", 0): demo_ok,
    ("demo", 130): demo_interrupted,
    ("demo", 141): demo_pipe_closed,
    ("install-startup", 0): install_ok,
    ("install-startup", 1): install_refused,
    ("install-startup", 2): install_usage,
    ("sidecar", 0): sidecar_ok,
    ("sidecar", 2): sidecar_usage,
    ("sidecar", 4): sidecar_port_busy,
    ("webhook", 0): webhook_ok,
    ("webhook", 2): webhook_usage,
    ("webhook", 4): webhook_port_busy,
}
"""How a user meets each exit code of each subcommand."""


def test_every_documented_exit_code_has_a_way_to_happen_and_no_way_is_undocumented():
    listed = {(name, code) for name, codes in documented().items() for code in codes}
    assert listed == set(WAYS)


def test_the_exit_codes_of_the_page_are_those_of_the_code():
    constants = {v for k, v in vars(exitcode).items() if k.isupper() and isinstance(v, int)}
    table = {int(n) for n in re.findall(r"^\| (\d+) \|", DOC.read_text(), re.M)}
    assert table == constants  # the table of docs/cli.md holds every code of oomsight.tools.exitcode
    assert {c for codes in documented().values() for c in codes} <= constants


def test_every_subcommand_of_the_command_line_has_its_exit_codes_on_the_page():
    from oomsight.tools.cli import _parser

    (sub,) = [a for a in _parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    assert set(sub.choices) == set(documented())


@pytest.mark.parametrize(("name", "code"), sorted(WAYS), ids=[f"{n}-{c}" for n, c in sorted(WAYS)])
def test_the_documented_exit_code_happens(name, code, tmp_path, monkeypatch):
    if name in ("sidecar", "webhook"):
        pytest.importorskip(f"oomsight_{name}")
    if name == "webhook" and code == 0:
        pytest.importorskip("cryptography")
    way = WAYS[(name, code)]
    result = way(tmp_path, monkeypatch) if "monkeypatch" in way.__code__.co_varnames else way(tmp_path)
    assert result.returncode == code, result.stderr
    assert result.left == [], f"temporary folders left: {result.left}"
