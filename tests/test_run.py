"""``oomsight run`` and the startup folder, with real subprocesses."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from oomsight.hook import startup

PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def oomsight(*args, env=None, timeout=120):
    return subprocess.run([PY, "-m", "oomsight", *args], capture_output=True, text=True, env=env, timeout=timeout)


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
