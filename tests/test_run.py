"""``oomsight run`` and the startup folder, with real subprocesses."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from oomsight.hook import startup

from clirun import said_well

PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def oomsight(*args, env=None, timeout=120):
    result = subprocess.run([PY, "-m", "oomsight", *args], capture_output=True, text=True, env=env, timeout=timeout)
    said_well(result.stderr)  # no traceback, no [Errno N] reaches the user
    return result


def script(tmp_path, body, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_the_exit_code_of_the_command_is_preserved(tmp_path):
    s = script(tmp_path, "import sys; sys.exit(7)")
    result = oomsight("run", "--port", "0", "--", PY, s)
    assert result.returncode == 7
    assert "oomsight memory report" in result.stderr


def test_a_command_killed_by_a_signal_exits_128_plus_n(tmp_path):
    s = script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert oomsight("run", "--port", "0", "--no-report", "--", PY, s).returncode == 128 + 15


def test_a_missing_command_is_a_clear_error(tmp_path):
    result = oomsight("run", "--port", "0", "--", str(tmp_path / "nope"))
    assert result.returncode == 127 and "cannot start" in result.stderr


def test_the_hook_loads_without_a_code_change_when_torch_is_imported(tmp_path):
    s = script(
        tmp_path,
        """
        import sys
        assert "oomsight" not in sys.modules, "loaded before torch"
        import torch
        assert "oomsight.hook.runtime" in sys.modules, "not loaded by import torch"
        print("hook-loaded")
        """,
    )
    result = oomsight("run", "--port", "0", "--", PY, s)
    assert result.returncode == 0, result.stderr
    assert "hook-loaded" in result.stdout
    # on a CPU-only machine the hook says once why it is idle
    assert result.stderr.count("oomsight: idle: torch.cuda.is_available() is False") == 1


def test_metrics_are_served_while_the_command_runs(tmp_path):
    port = free_port()
    s = script(
        tmp_path,
        f"""
        import urllib.request
        body = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "oomsight_build_info" in body, body
        assert 'oomsight_source_up{{local_rank="",rank="",source="spool"}} 1.0' in body, body
        print("scraped")
        """,
    )
    result = oomsight("run", "--port", str(port), "--", PY, s)
    assert result.returncode == 0, result.stderr
    assert "scraped" in result.stdout


def test_the_startup_folder_chain_loads_an_existing_sitecustomize(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins; builtins.USER_SITE_LOADED = True\n")
    folder = startup.install(str(tmp_path / "boot"), copy=True)
    env = {**os.environ, "PYTHONPATH": startup.pythonpath_with(folder, str(user))}
    code = "import builtins, sys; print(getattr(builtins, 'USER_SITE_LOADED', False), 'torch' in sys.modules)"
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["True", "False"], out.stderr  # chained, and torch not imported eagerly


def test_the_startup_folder_does_nothing_when_disabled(tmp_path):
    folder = startup.install(str(tmp_path / "boot"))
    env = {**os.environ, "PYTHONPATH": folder, "OOMSIGHT_DISABLED": "1"}
    code = "import torch, sys; print('oomsight' in sys.modules)"
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_report_of_a_missing_directory_is_a_clear_error(tmp_path):
    result = oomsight("report", str(tmp_path / "nope"))
    assert result.returncode == 2 and "is not a directory" in result.stderr


def test_report_prints_processes_and_ooms_of_a_spool(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.dirname(__file__))
    from fakes import GIB
    from spoolmaker import hooked_process

    spool = str(tmp_path / "spool")
    hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    hook.uncaught = RuntimeError("CUDA out of memory")
    hook.at_exit()
    result = oomsight("report", spool)
    assert result.returncode == 0
    out = result.stdout
    assert "rank 0 (local rank 0, world 2)" in out and "exited (oom)" in out
    assert "peak allocated 4.00 GiB" in out and "capacity 140.00 GiB" in out
    assert "CUDA out-of-memory events: 1" in out and "-> FATAL" in out
    assert "cause: oversized_request" in out


@pytest.mark.parametrize("bad", [["run"], ["run", "--"]])
def test_run_without_a_command_explains_itself(bad):
    result = oomsight(*bad)
    assert result.returncode == 2 and "give the command after --" in result.stderr


def ours_in(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith(("oomsight-run-", "oomsight-startup-")))


def test_run_removes_the_temporary_folders_it_made(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    s = script(tmp_path, "import os; print(os.environ['OOMSIGHT_DIR'], os.environ['PYTHONPATH'].split(os.pathsep)[0])")
    result = oomsight("run", "--port", "0", "--", PY, s, env={**os.environ, "TMPDIR": str(tmp)})
    assert result.returncode == 0, result.stderr
    spool, boot = result.stdout.split()
    assert os.path.basename(spool).startswith("oomsight-run-") and os.path.basename(boot).startswith(
        "oomsight-startup-"
    )
    assert ours_in(tmp) == []
    assert f"oomsight: removed the temporary spool {spool} (--spool DIR keeps one)" in result.stderr


def test_run_keeps_a_spool_given_with_spool(tmp_path):
    spool = tmp_path / "mine"
    result = oomsight("run", "--port", "0", "--spool", str(spool), "--", PY, "-c", "pass")
    assert result.returncode == 0 and spool.is_dir() and "removed" not in result.stderr


def test_run_keeps_a_temporary_spool_that_holds_a_memory_snapshot(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    body = "import os; d = os.path.join(os.environ['OOMSIGHT_DIR'], 'artifacts'); os.makedirs(d, exist_ok=True)\n"
    body += "open(os.path.join(d, 'p-1.oom-00001.pickle'), 'wb').write(b'x')\n"
    result = oomsight("run", "--port", "0", "--", PY, script(tmp_path, body), env={**os.environ, "TMPDIR": str(tmp)})
    (kept,) = ours_in(tmp)
    assert kept.startswith("oomsight-run-")
    assert f"oomsight: kept {tmp / kept}: it holds 1 artifact(s)" in result.stderr


def test_a_busy_port_given_with_port_is_one_line_and_exits_4_before_the_command_runs(tmp_path):
    marker = tmp_path / "ran"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = oomsight("run", "--port", str(port), "--", PY, "-c", f"open({str(marker)!r}, 'w')")
    assert result.returncode == 4 and not marker.exists()
    assert (
        f"oomsight run: port {port} on 127.0.0.1 is in use; choose another with --port N (0 picks one)" in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_a_busy_default_port_makes_run_serve_on_a_free_one(tmp_path):
    import io

    from oomsight.tools.run import RunOptions, run

    out = io.StringIO()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        opts = RunOptions(
            [PY, "-c", "pass"], port=port, spool_dir=str(tmp_path / "s"), report=False, port_fallback=True
        )
        assert run(opts, out) == 0
    text = out.getvalue()
    assert f"oomsight: port {port} is in use (another oomsight run?); serving on a free port instead" in text
    served = int(text.split("metrics at http://127.0.0.1:")[1].split("/")[0])
    assert served not in (0, port)


def test_two_runs_at_once_with_port_0_both_serve_their_own_metrics(tmp_path):
    import re

    wait = script(tmp_path, "import time; time.sleep(3)")
    jobs = [
        subprocess.Popen(
            [PY, "-m", "oomsight", "run", "--port", "0", "--", PY, wait], stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    errs = [job.communicate(timeout=120)[1] for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], errs
    ports = {int(re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", err).group(1)) for err in errs}
    assert len(ports) == 2


def test_a_script_that_does_not_exist_is_one_line_and_exits_2(tmp_path):
    result = oomsight("run", "--port", "0", "--", PY, str(tmp_path / "nope.py"), "--lr", "3")
    assert result.returncode == 2
    assert result.stderr == f"oomsight run: {tmp_path / 'nope.py'}: no such script\n"


def test_a_tape_in_a_missing_folder_is_one_line_and_exits_2(tmp_path):
    result = oomsight("run", "--port", "0", "--tape", str(tmp_path / "no" / "x.tape"), "--", PY, "-c", "pass")
    assert (
        result.returncode == 2
        and result.stderr == f"oomsight run: {tmp_path / 'no' / 'x.tape'}: its folder does not exist\n"
    )


def test_there_is_no_profiling_hint_where_no_process_uses_a_gpu(tmp_path):
    result = oomsight("run", "--port", "0", "--", PY, script(tmp_path, "import torch, time; time.sleep(1.5)"))
    assert result.returncode == 0, result.stderr
    assert "oomsight profile" not in result.stderr


def test_the_profiling_hint_appears_once_a_process_uses_a_device(tmp_path, monkeypatch):
    import io
    import threading

    from oomsight.tools.run import announce_profiling

    sys.path.insert(0, os.path.dirname(__file__))
    from spoolmaker import hooked_process

    spool = str(tmp_path / "spool")
    out, stop = io.StringIO(), threading.Event()
    stop.set()  # the job ended before any process used a device
    assert announce_profiling(spool, out, stop, interval=0.01) is False and out.getvalue() == ""
    hooked_process(spool, monkeypatch=monkeypatch)
    assert announce_profiling(spool, out, threading.Event(), interval=0.01) is True
    assert (
        out.getvalue()
        == f"oomsight: profile the running job with: oomsight profile --spool {spool} --steps 5 --wait 60\n"
    )


def test_an_oom_under_a_process_cap_reads_as_the_cap_and_the_free_memory_of_the_device(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from fakes import GIB
    from spoolmaker import hooked_process

    spool = str(tmp_path / "spool")
    _hook, cuda = hooked_process(spool)
    cuda.observer(0, 16 << 20, 7 * GIB, 130 * GIB)  # torch passes the cap as the total
    (name,) = os.listdir(os.path.join(spool, "events"))
    path = os.path.join(spool, "events", name)
    with open(path) as fh:
        event = json.load(fh)
    event["device_free_bytes"] = 130 * GIB  # as hooks before the cap was accounted wrote it (the demo's tape)
    with open(path, "w") as fh:
        json.dump(event, fh)
    out = oomsight("report", spool).stdout
    assert "process cap 7.00 GiB (set_per_process_memory_fraction), 130.00 GiB free on the device" in out
    assert "free 130.00 GiB of 7.00 GiB" not in out


def test_a_tape_that_cannot_be_written_is_one_line_and_exits_1_before_the_command_runs(tmp_path):
    """Issue 36: ``--tape DIR`` printed a thread's traceback, wrote no tape and exited 0."""
    marker = tmp_path / "ran"
    result = oomsight(
        "run", "--port", "0", "--tape", str(tmp_path), "--", PY, "-c", f"open({str(marker)!r}, 'w').close()"
    )
    assert result.returncode == 1, result.stderr  # exitcode.REFUSED
    assert f"oomsight run: cannot write the tape {tmp_path}: Is a directory\n" in result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


def test_a_tape_whose_writes_fail_midway_is_one_line_and_exits_1(tmp_path):
    result = oomsight("run", "--port", "0", "--tape", "/dev/full", "--", PY, "-c", "pass")
    assert result.returncode == 1, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "tape" in ln]
    assert lines == ["oomsight run: cannot write the tape /dev/full: No space left on device; it stops here"]
    assert "Traceback" not in result.stderr
