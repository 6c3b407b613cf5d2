"""The sidecar's servers under load and abuse, as a real process on loopback: idle
connections closed, a connection cap, a request deadline against trickling clients, a
request-head cap, no busy loop at the descriptor limit, IPv6 listen addresses."""

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from procs import free_port, http_get, sidecar, wait_for


def sidecar_env(**limits):
    return {**os.environ, **{f"OOMSIGHT_SIDECAR_{k.upper()}": str(v) for k, v in limits.items()}}


def closed_by_server(sock, within):
    """True if the server closes ``sock`` (recv returns b"" or a reset) within ``within`` s."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_are_closed_after_the_idle_timeout(tmp_path):
    with sidecar(str(tmp_path), env=sidecar_env(idle_timeout_seconds=0.5)) as (_, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        start = time.monotonic()
        assert all(closed_by_server(s, within=5) for s in idle)
        assert time.monotonic() - start < 5
        for s in idle:
            s.close()
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200


def test_connections_over_the_cap_get_503_at_once_and_the_cap_frees_up(tmp_path):
    env = sidecar_env(max_connections=4, idle_timeout_seconds=10)
    with sidecar(str(tmp_path), env=env) as (_, port):
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.3)  # let the server take them
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert extra.recv(100).startswith(b"HTTP/1.1 503")
        extra.close()
        for s in held:
            s.close()
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, timeout=5)
        metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        assert 'oomsight_sidecar_http_errors_total{reason="over_capacity"} 1.0' in metrics


def test_a_client_trickling_its_request_is_cut_off_at_the_request_deadline(tmp_path):
    env = sidecar_env(idle_timeout_seconds=10, request_timeout_seconds=1)
    with sidecar(str(tmp_path), env=env) as (_, port):
        sock = socket.create_connection(("127.0.0.1", port))
        start = time.monotonic()
        sock.settimeout(0.3)
        cut = False
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":
                    cut = True
                    break
            except TimeoutError:
                continue  # nothing to read yet: the connection is still open
            except OSError:
                cut = True
                break
        sock.close()
        assert cut and time.monotonic() - start < 5


def test_a_request_head_over_the_cap_is_refused(tmp_path):
    with sidecar(str(tmp_path)) as (_, port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
        try:
            reply = sock.recv(100)
        except ConnectionResetError:
            reply = b""
        sock.close()
        assert not reply.startswith(b"HTTP/1.0 200")
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200


def _cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_at_the_descriptor_limit_the_accept_loop_backs_off_instead_of_spinning(tmp_path):
    port = free_port()

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    env = sidecar_env(max_connections=1000, idle_timeout_seconds=60, request_timeout_seconds=60)
    cmd = [sys.executable, "-m", "oomsight", "sidecar", "--spool", str(tmp_path), "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        env=env,
        preexec_fn=few_descriptors,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients = []
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200)
        for _ in range(80):  # more than it has descriptors for; connecting without waiting, the backlog holds some
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            clients.append(client)
        time.sleep(1.0)
        before = _cpu_seconds(proc.pid)
        time.sleep(2.0)
        used = _cpu_seconds(proc.pid) - before
        assert used < 0.5, f"the sidecar used {used:.2f} s of CPU in 2 s at the descriptor limit"
    finally:
        for s in clients:
            s.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def _ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_listen_addresses_work_for_metrics_and_admin(tmp_path):
    port, admin = free_port(), free_port()
    env = {**os.environ, "OOMSIGHT_ADMIN_HOST": "::1", "OOMSIGHT_ADMIN_PORT": str(admin)}
    cmd = [sys.executable, "-m", "oomsight", "sidecar", "--spool", str(tmp_path), "--host", "::1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: http_get(f"http://[::1]:{port}/healthz")[0] == 200, timeout=20)
        assert http_get(f"http://[::1]:{admin}/admin/profiles")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0, proc.stderr.read()
