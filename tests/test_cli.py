"""The ``oomsight`` command line as a new user meets it: one-line errors with documented exit
codes, help with defaults and examples, progress on long waits (``docs/cli.md``)."""

import argparse
import gzip
import io
import json
import os

import pytest

from oomsight.tools import cli, exitcode, profile_request
from oomsight.wire.spool import PROFILES, SpoolReader, write_atomic

from clirun import said_well
from fakes import GIB
from spoolmaker import hooked_process


class Terminal(io.StringIO):
    """stderr as an interactive terminal."""

    def isatty(self):
        return True


def run_cli(argv, monkeypatch, stderr=None):
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    rc = cli.main(argv)
    said_well(err.getvalue())  # no traceback, no [Errno N] reaches the user
    return rc, out.getvalue(), err.getvalue()


def test_profile_of_a_missing_spool_says_the_folder_is_missing_and_exits_2(tmp_path, monkeypatch):
    rc, out, err = run_cli(["profile", "--spool", str(tmp_path / "nope")], monkeypatch)
    assert rc == exitcode.USAGE == 2
    assert err == f"oomsight profile: {tmp_path / 'nope'}: no such spool folder (oomsight run prints the one it uses)\n"
    assert out == "" and "no live training process" not in err


def test_profile_prints_prose_by_default_without_any_json(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    rc, out, err = run_cli(["profile", "--spool", spool, "--steps", "4"], monkeypatch)
    assert rc == 0, err
    assert out.startswith("asked 1 process(es) to profile optimizer steps ") and "(CUDA time and memory)" in out
    assert "{" not in out and err == ""


def test_profile_with_json_prints_only_json_lines_on_stdout(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    rc, out, _ = run_cli(["profile", "--spool", spool, "--steps", "4", "--memory-only", "--json"], monkeypatch)
    assert rc == 0
    (body,) = [json.loads(line) for line in out.splitlines()]
    assert body["processes"] == 1 and body["cuda_time"] is False


def test_a_refused_profile_is_one_line_on_stderr_and_exits_1(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    assert run_cli(["profile", "--spool", spool], monkeypatch)[0] == 0
    rc, out, err = run_cli(["profile", "--spool", spool], monkeypatch)
    assert rc == exitcode.REFUSED == 1 and out == ""
    assert err.startswith("oomsight profile: a profile is already pending") and err.count("\n") == 1


def test_profile_steps_out_of_range_is_a_usage_error(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    rc, _, err = run_cli(["profile", "--spool", spool, "--steps", "0"], monkeypatch)
    assert rc == exitcode.USAGE and "steps must be between 1 and 100" in err


def test_waiting_for_profiles_shows_progress_on_a_terminal_and_times_out_with_exit_3(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    rc, _, err = run_cli(["profile", "--spool", spool, "--wait", "0.6"], monkeypatch, stderr=Terminal())
    assert rc == exitcode.TIMED_OUT == 3
    assert "\rwaiting for profiles: 0/1 processes done, 1 s left" in err
    assert err.endswith(
        "oomsight profile: 0 of 1 processes answered within 0.6 s; later answers land in "
        + os.path.join(spool, "profiles")
        + "\n"
    )


def test_waiting_for_profiles_is_quiet_when_stderr_is_not_a_terminal(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    rc, _, err = run_cli(["profile", "--spool", spool, "--wait", "0.5"], monkeypatch)
    assert rc == exitcode.TIMED_OUT and "\r" not in err and "waiting for profiles" not in err


def _answer(spool, request_id):
    """The profile document a rank writes when its window is done."""
    (snap,) = SpoolReader(spool).read().snapshots
    op = {"op": "aten::mm", "calls": 12, "self_cuda_memory_bytes": 3 * GIB, "self_cuda_time_us": 5.0}
    doc = {
        "schema_version": 1,
        "kind": "profile",
        "process": snap["process"],
        "request_id": request_id,
        "start_step": 9,
        "steps": 5,
        "started_at": 1.0,
        "ended_at": 2.0,
        "device": 0,
        "peak_allocated_bytes": 5 * GIB,
        "top_by_memory": [op | {"cuda_time_us": 7.0, "cpu_time_us": 1.0}],
        "top_by_time": [],
        "table_artifact": "x.table.txt",
        "trace_artifact": None,
    }
    os.makedirs(os.path.join(spool, PROFILES), exist_ok=True)
    write_atomic(os.path.join(spool, PROFILES, f"{request_id}.json"), json.dumps(doc).encode(), durable=False)


def test_the_answers_of_every_process_are_printed_in_units_people_read(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    out, err = io.StringIO(), io.StringIO()
    sleeps = []

    def sleep(seconds):
        if not sleeps:
            (req,) = os.listdir(os.path.join(spool, "requests"))
            with open(os.path.join(spool, "requests", req)) as fh:
                _answer(spool, json.load(fh)["id"])
        sleeps.append(seconds)

    rc = profile_request.run(profile_request.ProfileCommand(spool, wait_seconds=30), out, err, sleep=sleep)
    assert rc == 0, err.getvalue()
    text = out.getvalue()
    assert "rank 0: steps 10-14, peak allocated 5.00 GiB; top operators by self CUDA memory:" in text
    assert "aten::mm" in text and "3.00 GiB" in text and "12 calls" in text and "artifact: x.table.txt" in text
    assert len(sleeps) == 1


def _tape(path, records=3):
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"tape": "oomsight-spool-tape", "version": 1, "start": 100.0, "meta": {}}) + "\n")
        for i in range(records):
            doc = {"n": i, "time": 100.0 + i}
            fh.write(json.dumps({"t": i * 0.01, "path": f"events/x{i}.json", "doc": doc}) + "\n")
    return str(path)


def test_replay_of_a_missing_tape_is_one_line_and_exits_2(tmp_path, monkeypatch):
    rc, _, err = run_cli(["replay", str(tmp_path / "none.tape"), "--spool", str(tmp_path / "s")], monkeypatch)
    assert rc == exitcode.USAGE and err == f"oomsight replay: {tmp_path / 'none.tape'}: no such tape\n"


def test_replay_of_a_file_that_is_not_a_tape_is_one_line_and_exits_2(tmp_path, monkeypatch):
    bogus = tmp_path / "bogus.tape"
    bogus.write_text("hello")
    rc, _, err = run_cli(["replay", str(bogus), "--spool", str(tmp_path / "s")], monkeypatch)
    assert rc == exitcode.USAGE and err.startswith(f"oomsight replay: {bogus}: not a readable tape")
    assert err.count("\n") == 1


def test_replay_shows_its_progress_on_a_terminal(tmp_path, monkeypatch):
    tape = _tape(tmp_path / "t.tape")
    spool = str(tmp_path / "s")
    rc, _, err = run_cli(["replay", tape, "--spool", spool, "--speed", "10"], monkeypatch, stderr=Terminal())
    assert rc == 0
    assert f"\rreplaying {tape}: 3/3 writes, 0 of 0 s" in err
    assert f"oomsight replay: wrote 3 documents into {spool}\n" in err
    assert err.endswith(
        "oomsight replay: a replay at speed 10 rescales time: the spool's timestamps are the tape's divided by 10, "
        "so charts over time are 10 times shorter than the run; step times, step counts and bytes are as recorded\n"
    )
    assert sorted(os.listdir(os.path.join(spool, "events"))) == ["x0.json", "x1.json", "x2.json"]


def test_replay_is_quiet_when_stderr_is_not_a_terminal(tmp_path, monkeypatch):
    rc, _, err = run_cli(["replay", _tape(tmp_path / "t.tape"), "--spool", str(tmp_path / "s")], monkeypatch)
    assert rc == 0 and "\r" not in err and "replaying" not in err


def test_install_startup_where_a_file_is_in_the_way_is_one_line_and_exits_1(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    rc, _, err = run_cli(["install-startup", str(tmp_path / "file" / "boot")], monkeypatch)
    assert rc == exitcode.REFUSED and err.startswith("oomsight install-startup: ") and err.count("\n") == 1


def _subcommands():
    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize("name", sorted(cli.EXAMPLES))
def test_every_argument_of_a_subcommand_has_help_and_says_its_default(name):
    parser = _subcommands()[name]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name} {action.dest} has no help"
        no_default = action.default in (None, False, argparse.SUPPRESS) or action.required or not action.option_strings
        assert no_default or "default" in action.help, f"{name} {action.dest}: the help does not say the default"


@pytest.mark.parametrize("name", sorted(cli.EXAMPLES))
def test_every_subcommand_shows_an_example(name):
    text = _subcommands()[name].format_help()
    assert "example" in text and f"oomsight {name}" in text.split("example", 1)[1]


def test_a_second_sidecar_on_a_busy_port_is_one_line_and_exits_4(tmp_path):
    import socket
    import subprocess
    import sys

    pytest.importorskip("oomsight_sidecar")
    env = {**os.environ, "OOMSIGHT_ADMIN_PORT": "0"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        cmd = [
            sys.executable,
            "-m",
            "oomsight",
            "sidecar",
            "--spool",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            port,
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == exitcode.PORT_BUSY == 4
    said = f"oomsight sidecar: port {port} on 127.0.0.1 is in use; choose another with --port N"
    assert result.stderr.startswith(said) and result.stderr.count("\n") == 1, result.stderr


def test_ctrl_c_during_a_replay_clears_the_progress_line_and_exits_130(tmp_path, monkeypatch):
    from oomsight.tools import tape as tape_module

    real = tape_module.replay

    def interrupted(*args, on_record=None, **kwargs):
        def record_then_stop(rec):
            on_record(rec)
            raise KeyboardInterrupt

        return real(*args, on_record=record_then_stop, **kwargs)

    monkeypatch.setattr(tape_module, "replay", interrupted)
    path = _tape(tmp_path / "t.tape")
    rc, _, err = run_cli(["replay", path, "--spool", str(tmp_path / "s")], monkeypatch, stderr=Terminal())
    assert rc == exitcode.INTERRUPTED == 130
    progress, cleared = err.split("\r")[1], err.split("\r")[2]
    assert progress.startswith("replaying") and cleared.strip() == ""
    assert err.endswith("\roomsight replay: interrupted\n")
