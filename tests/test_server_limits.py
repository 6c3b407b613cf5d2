"""The sidecar's servers under load and abuse, as a real process on loopback: idle
connections closed, a connection cap, a request deadline against trickling clients, a
request-head cap, no busy loop at the descriptor limit, IPv6 listen addresses."""

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from oomsight_server.listener import ServerLimits
from oomsight_server.wsgi import serve, stop

from procs import as_this_machine_gives, free_port, http_get, sidecar, wait_for


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
        assert all(closed_by_server(s, within=as_this_machine_gives(5)) for s in idle)
        assert time.monotonic() - start < as_this_machine_gives(5)
        for s in idle:
            s.close()
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200


def test_over_the_cap_the_idlest_connection_is_closed_and_the_newcomer_is_served(tmp_path):
    env = sidecar_env(max_connections=4, idle_timeout_seconds=10)
    with sidecar(str(tmp_path), env=env) as (_, port):
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200)
        held = []
        for _ in range(4):
            held.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.05)  # an order of idleness the server can tell
        held[0].sendall(b"GET /metrics HTTP/1.1\r\n")  # a partial head: now the least idle
        time.sleep(0.2)
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200  # the newcomer, over the cap
        assert closed_by_server(held[1], within=2)  # the idlest went first
        assert not any(closed_by_server(s, within=0.1) for s in (held[0], *held[2:]))
        held += [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # over the cap again
        assert closed_by_server(held[2], within=2)
        assert not any(closed_by_server(s, within=0.1) for s in (held[0], held[3], *held[4:]))
        for s in held:
            s.close()
        metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        found = re.search(r'oomsight_sidecar_http_errors_total\{reason="over_capacity"\} ([0-9.]+)', metrics)
        assert found is not None and float(found.group(1)) >= 2.0


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
        assert cut and time.monotonic() - start < as_this_machine_gives(5)


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


def ok(environ, start_response):
    start_response("200 OK", [("Content-Length", "3")])
    return [b"ok\n"]


def _process_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_at_the_descriptor_limit_the_accept_loop_backs_off_instead_of_spinning():
    server = serve(ok, "127.0.0.1", 0, ServerLimits(idle_timeout_seconds=30))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients = [socket.create_connection(("127.0.0.1", server.server_port))]  # one served: a thread waits on it
    fillers = []
    try:
        time.sleep(0.2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 2, hard))
        with contextlib.suppress(OSError):
            while True:  # fill every free descriptor number below the limit
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        os.close(fillers.pop())
        clients.append(socket.create_connection(("127.0.0.1", server.server_port)))  # the last descriptor
        time.sleep(0.3)  # it waits in the backlog: the server has no descriptor left to accept it with
        before = _process_cpu_seconds()
        time.sleep(1.5)
        used = _process_cpu_seconds() - before
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for client in clients:
            client.close()
    assert server.errors.counts()["out_of_descriptors"] >= 1  # the limit was reached
    assert used < 0.3, f"{used:.2f} s of CPU in 1.5 s at the descriptor limit"
    assert http_get(f"http://127.0.0.1:{server.server_port}/")[0] == 200  # and it serves again after
    stop(server)


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
