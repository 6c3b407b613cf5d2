"""Connection attacks on the real sidecar and webhook (subprocesses, loopback only): thousands
of silent or slow-headers connections, 16 silent TCP connections on the webhook, HTTP/0.9.
The client that matters (Prometheus on ``/metrics``, the API server on ``/mutate``) must be
answered 200 in under a second of an unshared machine throughout (``procs.as_this_machine_gives``),
and memory stays under the chart's limits. Each attack is bounded in connections and in seconds
(docs/testing.md, "Attacks")."""

import contextlib
import os
import socket
import ssl
import time

import pytest
import yaml

from procs import as_this_machine_gives, http_get, sidecar
from spoolmaker import hooked_process
from webhookproc import Attack, raise_descriptor_limit, review, status_kib, timed, webhook_process

ATTACKERS = 2000
PROBES = 15
ANSWER_SECONDS = 1.0


def chart_memory_limit_kib(component):
    """``<component>.resources.limits.memory`` of the chart's values.yaml, in KiB."""
    with open(os.path.join(os.path.dirname(__file__), "..", "helm", "oomsight", "values.yaml")) as fh:
        limit = yaml.safe_load(fh)[component]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) * 1024


SIDECAR_LIMIT_KIB = chart_memory_limit_kib("sidecar")
WEBHOOK_LIMIT_KIB = chart_memory_limit_kib("webhook")
WEBHOOK_CAP = 256  # OOMSIGHT_WEBHOOK_MAX_CONNECTIONS default
SIDECAR_CAP = 1024  # OOMSIGHT_SIDECAR_MAX_CONNECTIONS default


@pytest.fixture(autouse=True)
def descriptors():
    raise_descriptor_limit(3 * ATTACKERS + 256)  # the attackers' ends here, skip-free


@pytest.fixture
def served_spool(tmp_path, monkeypatch):
    spool = str(tmp_path / "spool")
    hooked_process(spool, monkeypatch=monkeypatch)
    return spool


def probe_metrics(port):
    def get():
        status, text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert "oomsight_" in text
        return status

    return [timed(get) for _ in range(PROBES)]


def assert_all_answered_in_time(probes):
    statuses = [result for _, result in probes]
    slowest = max(seconds for seconds, _ in probes)
    assert statuses == [200] * len(probes), statuses
    assert slowest < as_this_machine_gives(ANSWER_SECONDS), f"slowest probe {slowest:.2f} s"


@pytest.mark.parametrize("mode", ["silent", "slow"])
def test_metrics_answer_200_within_a_second_while_2000_connections_are_silent_or_slow(served_spool, mode):
    with sidecar(served_spool) as (proc, port):
        with Attack("127.0.0.1", port, ATTACKERS, mode=mode, seconds=6) as attack:
            time.sleep(1.0)  # the slow ones have sent a few bytes each
            probes = probe_metrics(port)
            held = attack.peak_open
        peak = status_kib(proc.pid, "VmHWM")
    assert_all_answered_in_time(probes)
    assert held >= SIDECAR_CAP  # the attack did fill the cap
    assert peak < SIDECAR_LIMIT_KIB, f"sidecar peak {peak / 1024:.0f} MiB"


def test_an_http_0_9_request_is_answered_or_closed_at_once_never_held(served_spool):
    with sidecar(served_spool) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            start = time.monotonic()
            sock.sendall(b"GET /metrics\r\n")
            reply = sock.recv(100)
            assert time.monotonic() - start < as_this_machine_gives(ANSWER_SECONDS)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400")
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train", "namespace": "team-a"},
    "spec": {"containers": [{"name": "train", "image": "pytorch", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
}


def probe_mutate(webhook):
    body = review(POD)

    def post():
        status, text = webhook.post(body)
        assert b'"patch"' in text  # injected, not a fail-open answer
        return status

    return [timed(post) for _ in range(PROBES)]


def test_sixteen_silent_tcp_connections_do_not_switch_admission_off(tmp_path):
    with webhook_process(str(tmp_path)) as webhook:
        silent = [socket.create_connection(("127.0.0.1", webhook.port)) for _ in range(16)]
        try:
            time.sleep(0.3)
            probes = probe_mutate(webhook)
            assert all(s.fileno() >= 0 for s in silent)
        finally:
            for s in silent:
                s.close()
    assert_all_answered_in_time(probes)


@pytest.mark.parametrize("mode", ["silent", "slow"])
def test_mutate_answers_within_a_second_while_2000_connections_are_silent_or_slow(tmp_path, mode):
    with webhook_process(str(tmp_path)) as webhook:
        with Attack("127.0.0.1", webhook.port, ATTACKERS, mode=mode, seconds=6) as attack:
            time.sleep(1.0)
            probes = probe_mutate(webhook)
            held = attack.peak_open
        evicted = webhook.counter('oomsight_webhook_errors_total{component="over_capacity"}')
        peak = status_kib(webhook.proc.pid, "VmHWM")
    assert_all_answered_in_time(probes)
    assert held >= WEBHOOK_CAP and evicted >= ATTACKERS - WEBHOOK_CAP  # over the cap: the oldest were closed
    assert peak < WEBHOOK_LIMIT_KIB, f"webhook peak {peak / 1024:.0f} MiB"


@pytest.mark.parametrize("mode", ["slow", "slow-body"])
def test_mutate_answers_within_a_second_while_400_tls_connections_trickle_their_heads_or_bodies(tmp_path, mode):
    with webhook_process(str(tmp_path)) as webhook:
        tls = webhook.client_context
        with Attack("127.0.0.1", webhook.port, 400, mode=mode, seconds=8, tls=tls) as attack:
            time.sleep(1.0)  # each has sent a byte or two of its head, inside TLS
            probes = probe_mutate(webhook)
            held = attack.peak_open
        peak = status_kib(webhook.proc.pid, "VmHWM")
    assert_all_answered_in_time(probes)
    assert held > WEBHOOK_CAP
    assert peak < WEBHOOK_LIMIT_KIB, f"webhook peak {peak / 1024:.0f} MiB"


def test_an_http_0_9_request_on_the_tls_port_is_answered_or_closed_at_once(tmp_path):
    with webhook_process(str(tmp_path)) as webhook:
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=3)
        with webhook.client_context.wrap_socket(raw, server_hostname="localhost") as sock:
            start = time.monotonic()
            sock.sendall(b"GET /healthz\r\n")
            try:
                reply = sock.recv(100)
            except (ConnectionResetError, ssl.SSLError):
                reply = b""
            assert time.monotonic() - start < as_this_machine_gives(ANSWER_SECONDS)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 400")
        assert webhook.post(review(POD))[0] == 200


def test_the_webhook_listens_only_on_its_listen_address(tmp_path):
    with webhook_process(str(tmp_path), host="127.0.0.3") as webhook:  # the attackers come from 127.0.0.2
        assert webhook.post(review(POD))[0] == 200
        with pytest.raises(ConnectionRefusedError), contextlib.closing(socket.socket()) as other:
            other.connect(("127.0.0.1", webhook.port))
