"""The sidecar's admin endpoint and ``oomsight profile``: tokens, refusals, artifacts."""

import io
import json
import os
import subprocess
import sys

import pytest

from oomsight.config import ConfigError
from oomsight.wire.requests import write_request
from oomsight_sidecar.admin import AdminApp, ensure_token
from oomsight_sidecar.settings import AdminSettings

from spoolmaker import hooked_process


def call(app, method, path, query="", token=None):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query, "wsgi.input": io.BytesIO()}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    seen = {}

    def start_response(status, headers):
        seen["status"] = int(status.split()[0])

    body = b"".join(app(environ, start_response))
    return seen["status"], body


def test_exposing_the_admin_endpoint_without_a_token_is_refused_at_start():
    with pytest.raises(ConfigError, match="without a token"):
        AdminSettings.from_env({"OOMSIGHT_ADMIN_HOST": "0.0.0.0"})
    assert (
        AdminSettings.from_env({"OOMSIGHT_ADMIN_HOST": "0.0.0.0", "OOMSIGHT_ADMIN_TOKEN": "s3cret"}).token == "s3cret"
    )
    assert AdminSettings.from_env({}).host == "127.0.0.1"  # loopback by default: kubectl port-forward


def test_with_a_token_requests_without_it_are_refused(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    app = AdminApp(spool, token="s3cret")
    assert call(app, "POST", "/admin/profile", "steps=5")[0] == 401
    assert call(app, "POST", "/admin/profile", "steps=5", token="wrong")[0] == 401
    status, body = call(app, "POST", "/admin/profile", "steps=5", token="s3cret")
    assert status == 202 and json.loads(body)["steps"] == 5


def test_a_request_while_a_profile_is_pending_is_refused_politely(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    app = AdminApp(spool, token=None)
    first = json.loads(call(app, "POST", "/admin/profile", "steps=3")[1])
    status, body = call(app, "POST", "/admin/profile", "steps=3")
    assert status == 409 and first["id"] in json.loads(body)["error"]


def test_a_request_while_a_process_reports_profiling_is_refused(spool, monkeypatch):
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)
    hook.sampler.extra = lambda: {"profiling": "other-run"}
    hook.sampler.publish()
    status, body = call(AdminApp(spool, None), "POST", "/admin/profile", "steps=3")
    assert status == 409 and "other-run" in json.loads(body)["error"]


def test_a_request_is_refused_when_no_live_process_can_be_profiled(spool, monkeypatch):
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)
    hook.sources["profiler"] = False  # TEARDOWN_CUPTI=1 in that process, or its step hook is off
    hook.sampler.publish()
    status, body = call(AdminApp(spool, None), "POST", "/admin/profile", "steps=3")
    assert status == 409 and "TEARDOWN_CUPTI=1" in json.loads(body)["error"]
    assert not os.listdir(os.path.join(spool, "requests"))  # nothing was asked of anyone


def test_bad_steps_and_no_process_are_clear_errors(spool, monkeypatch):
    app = AdminApp(spool, None)
    os.makedirs(spool)
    assert call(app, "POST", "/admin/profile", "steps=0")[0] == 400
    assert call(app, "POST", "/admin/profile", "steps=x")[0] == 400
    status, body = call(app, "POST", "/admin/profile", "steps=5")
    assert status == 409 and "no live training process" in json.loads(body)["error"]
    assert call(app, "GET", "/admin/profile")[0] == 405


def test_artifacts_are_served_by_plain_name_only(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    with open(os.path.join(spool, "artifacts", "x.oom-00001.pickle"), "wb") as fh:
        fh.write(b"snap")
    app = AdminApp(spool, None)
    assert call(app, "GET", "/admin/artifacts/x.oom-00001.pickle") == (200, b"snap")
    assert call(app, "GET", "/admin/artifacts/..%2f..%2fetc%2fpasswd")[0] in (400, 404)
    assert call(app, "GET", "/admin/artifacts/.hidden")[0] == 400
    assert call(app, "GET", "/admin/artifacts/missing.txt")[0] == 404


def test_the_profile_command_writes_an_aligned_request(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    out = subprocess.run(
        [sys.executable, "-m", "oomsight", "profile", "--spool", spool, "--steps", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout.splitlines()[0])
    assert body["processes"] == 1 and body["start_step"] >= 3
    again = subprocess.run(
        [sys.executable, "-m", "oomsight", "profile", "--spool", spool, "--steps", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 1 and "already pending" in again.stderr


def _request_doc(spool):
    (name,) = os.listdir(os.path.join(spool, "requests"))
    with open(os.path.join(spool, "requests", name)) as fh:
        return json.load(fh)


@pytest.mark.parametrize(("query", "cuda_time"), [("steps=3", True), ("steps=3&memory_only=1", False)])
def test_the_admin_endpoint_asks_for_a_memory_only_window_when_told(spool, monkeypatch, query, cuda_time):
    hooked_process(spool, monkeypatch=monkeypatch)
    status, body = call(AdminApp(spool, None), "POST", "/admin/profile", query)
    assert status == 202 and json.loads(body)["cuda_time"] is cuda_time
    assert _request_doc(spool)["cuda_time"] is cuda_time


def test_a_wrong_memory_only_value_is_a_clear_error(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    status, body = call(AdminApp(spool, None), "POST", "/admin/profile", "steps=3&memory_only=maybe")
    assert status == 400 and "memory_only" in json.loads(body)["error"]
    assert not os.path.isdir(os.path.join(spool, "requests")) or not os.listdir(os.path.join(spool, "requests"))


def test_the_profile_command_asks_for_a_memory_only_window(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    cmd = [sys.executable, "-m", "oomsight", "profile", "--spool", spool, "--steps", "2", "--memory-only", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["cuda_time"] is False
    assert _request_doc(spool)["cuda_time"] is False


def test_old_unanswered_requests_stop_blocking(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    path = write_request(spool, "stale", 3, 0)
    with open(path) as fh:
        doc = json.load(fh)
    doc["created_at"] -= 600
    with open(path, "w") as fh:
        json.dump(doc, fh)
    assert call(AdminApp(spool, None), "POST", "/admin/profile", "steps=3")[0] == 202


def test_an_artifact_that_is_a_symbolic_link_out_of_the_spool_is_not_served(spool, monkeypatch, tmp_path):
    hooked_process(spool, monkeypatch=monkeypatch)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"node credentials")
    os.symlink(secret, os.path.join(spool, "artifacts", "x.oom-00002.pickle"))
    status, body = call(AdminApp(spool, None), "GET", "/admin/artifacts/x.oom-00002.pickle")
    assert status == 404 and b"credentials" not in body


def test_an_artifact_that_is_a_hard_link_to_a_file_outside_the_spool_is_not_served(spool, monkeypatch, tmp_path):
    hooked_process(spool, monkeypatch=monkeypatch)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"node credentials")
    os.link(secret, os.path.join(spool, "artifacts", "x.oom-00002.pickle"))
    status, body = call(AdminApp(spool, None), "GET", "/admin/artifacts/x.oom-00002.pickle")
    assert status == 404 and b"credentials" not in body
    os.unlink(secret)  # its only name is in the spool now: an artifact like any other
    assert call(AdminApp(spool, None), "GET", "/admin/artifacts/x.oom-00002.pickle")[0] == 200


def test_an_artifacts_folder_that_is_a_symbolic_link_serves_nothing(spool, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "passwd").write_bytes(b"root:x:0:0")
    os.makedirs(spool)
    os.symlink(elsewhere, os.path.join(spool, "artifacts"))
    assert call(AdminApp(spool, None), "GET", "/admin/artifacts/passwd")[0] == 404


def test_a_fifo_by_an_artifacts_name_is_refused_without_blocking(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    os.mkfifo(os.path.join(spool, "artifacts", "x.trace.json"))
    assert call(AdminApp(spool, None), "GET", "/admin/artifacts/x.trace.json")[0] == 404


def test_a_large_artifact_is_streamed_in_chunks_not_read_whole(spool, monkeypatch):
    import tracemalloc

    hooked_process(spool, monkeypatch=monkeypatch)
    size = 32 * 1024 * 1024
    with open(os.path.join(spool, "artifacts", "x.oom-00003.pickle"), "wb") as fh:
        fh.truncate(size)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/admin/artifacts/x.oom-00003.pickle", "QUERY_STRING": ""}
    headers = {}
    tracemalloc.start()
    try:
        body = AdminApp(spool, None)(environ, lambda status, h: headers.update(h))
        total = largest = 0
        for chunk in body:
            total, largest = total + len(chunk), max(largest, len(chunk))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (total, headers["Content-Length"]) == (size, str(size))
    assert largest <= 64 * 1024 and peak < 2 * 1024 * 1024


def test_a_taken_admin_port_turns_only_the_admin_endpoint_off(tmp_path):
    import socket

    from procs import http_get, sidecar

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "OOMSIGHT_ADMIN_PORT": str(taken.getsockname()[1])}
        with sidecar(str(tmp_path), env=env) as (proc, port):
            assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200
            assert proc.poll() is None


def test_auto_picks_a_free_admin_port_and_logs_it(tmp_path):
    import re

    from procs import http_get, sidecar

    env = {**os.environ, "OOMSIGHT_ADMIN_PORT": "auto"}
    with sidecar(str(tmp_path), env=env) as (proc, _):
        line = proc.stdout.readline()  # logged before the metrics server's line, which came before /healthz
        admin = re.search(r"admin endpoint on http://127\.0\.0\.1:(\d+)/admin/", line)
        assert admin and int(admin.group(1)) not in (0, 21401), line
        assert http_get(f"http://127.0.0.1:{admin.group(1)}/admin/profiles")[0] == 200


def test_a_required_token_is_made_private_and_every_request_needs_it(spool, tmp_path):
    token_file = str(tmp_path / ".admin-token")
    env = {"OOMSIGHT_ADMIN_REQUIRE_TOKEN": "1", "OOMSIGHT_ADMIN_TOKEN_FILE": token_file}
    settings = ensure_token(AdminSettings.from_env(env))
    assert settings.token and os.stat(token_file).st_mode & 0o777 == 0o600
    with open(token_file) as fh:
        assert fh.read().strip() == settings.token
    assert ensure_token(AdminSettings.from_env(env)).token == settings.token  # a restart keeps it
    os.makedirs(spool)
    app = AdminApp(spool, settings.token)
    assert call(app, "GET", "/admin/profiles")[0] == 401
    assert call(app, "GET", "/admin/profiles", token=settings.token)[0] == 200
    with pytest.raises(ConfigError, match="OOMSIGHT_ADMIN_REQUIRE_TOKEN=1 needs"):
        AdminSettings.from_env({"OOMSIGHT_ADMIN_REQUIRE_TOKEN": "1"})


def test_a_download_slower_than_the_request_deadline_is_not_cut_off(spool, monkeypatch):
    import http.client
    import time

    from oomsight_server.listener import ServerLimits
    from oomsight_server.wsgi import serve, stop

    hooked_process(spool, monkeypatch=monkeypatch)
    size = 32 * 1024 * 1024
    with open(os.path.join(spool, "artifacts", "x.oom-00004.pickle"), "wb") as fh:
        fh.truncate(size)
    limits = ServerLimits(idle_timeout_seconds=5, request_timeout_seconds=0.5)
    server = serve(AdminApp(spool, None), "127.0.0.1", 0, limits)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
        conn.request("GET", "/admin/artifacts/x.oom-00004.pickle")
        resp = conn.getresponse()
        start, got = time.monotonic(), 0
        while chunk := resp.read(256 * 1024):
            got += len(chunk)
            time.sleep(0.02)  # a slow client: 128 reads take longer than the deadline
        assert time.monotonic() - start > 1.0 and got == size
    finally:
        stop(server)
