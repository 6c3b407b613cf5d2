"""The four small CLI inconsistencies of issue 35 (step 6), each as a new user met it: a busy
``--port``, ``profile --json``'s error, the demo's virtualenv without numpy, and a kept demo
spool reported again."""

from __future__ import annotations

import io
import os
import re
import socket

from oomsight.tools import cli, demo, exitcode

from clirun import oomsight

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_busy_port_given_with_port_is_one_line_on_stderr_and_nothing_started(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = oomsight("run", "--port", str(port), "--", "python3", "-c", "pass", tmp=str(tmp_path / "tmp"))
    assert done.returncode == exitcode.PORT_BUSY == 4
    assert done.stderr.splitlines() == [
        f"oomsight run: port {port} on 127.0.0.1 is in use; choose another with --port N (0 picks one)"
    ]
    assert done.stdout == "" and done.left == []  # no spool made, none left


def test_profile_with_json_writes_its_refusal_to_stderr_and_nothing_to_stdout(tmp_path):
    done = oomsight("profile", "--spool", str(tmp_path), "--json", tmp=str(tmp_path / "tmp"))
    assert done.returncode == exitcode.REFUSED == 1
    assert done.stdout == ""
    assert done.stderr == "oomsight profile: no live training process in this spool to profile\n"


def test_the_demo_virtualenv_installs_numpy_beside_the_package():
    with open(os.path.join(ROOT, "Makefile")) as fh:
        recipe = fh.read().split("$(DEMO_VENV)/.ready:", 1)[1].split("\n\n", 1)[0]
    installs = [line for line in recipe.splitlines() if "pip install" in line and "-e ." in line]
    assert installs and all(re.search(r"\bnumpy\b", line) for line in installs), recipe


def test_a_kept_demo_replay_spool_is_labelled_a_replay_when_reported_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(demo.tempfile, "tempdir", None)
    monkeypatch.setattr(demo, "_serve_replay", lambda spool, writes, speed: None)  # the spool's contents: not at issue
    assert demo._replay(speed=100.0, keep=True) == 0
    banner = capsys.readouterr().out.splitlines()[0]
    (spool,) = [str(p) for p in tmp_path.iterdir() if p.name.startswith("oomsight-demo-")]
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    assert cli.main(["report", spool]) == exitcode.OK
    assert out.getvalue().splitlines()[0] == banner
    assert "REPLAY of a run recorded on" in banner and "not a live run" in banner


def test_a_spool_of_a_live_run_carries_no_replay_label(tmp_path):
    assert demo.replay_label(str(tmp_path)) is None
