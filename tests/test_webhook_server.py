"""The webhook as a real HTTPS server: certificate made in the test, real AdmissionReview
requests for realistic pods, the JSONPatch applied and validated, odd requests refused."""

import base64
import contextlib
import datetime
import http.client
import json
import socket
import ssl
import threading
import time

import pytest

from oomsight_webhook.certs import make_ca, make_serving
from oomsight_webhook.injection import InjectionSettings
from oomsight_webhook.main import run
from oomsight_webhook.settings import WebhookSettings
from oomsight_webhook.tls import FileCertificates

from kubetools import apply, fixture, validate
from procs import as_this_machine_gives, free_port, http_get, wait_for

INJECTION = InjectionSettings(image="ghcr.io/oomsight/oomsight:0.1.0")


class Webhook:
    def __init__(self, tmp_path):
        now = datetime.datetime.now(datetime.timezone.utc)
        self.ca = make_ca("test-ca", now)
        self.cert_file, self.key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
        self.issue(now)
        self.port, self.metrics_port = free_port(), free_port()
        self.settings = WebhookSettings(
            host="127.0.0.1",
            port=self.port,
            metrics_port=self.metrics_port,
            tls_mode="files",
            cert_file=str(self.cert_file),
            key_file=str(self.key_file),
            cert_dir=str(tmp_path / "loaded"),
            tls_reconcile_seconds=0.2,
        )
        self.client_context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())

    def issue(self, now):
        serving = make_serving(self.ca, ["oomsight-webhook.oomsight.svc", "localhost"], now)
        self.cert_file.write_bytes(serving.cert_pem)
        self.key_file.write_bytes(serving.key_pem)
        return serving

    def connection(self):
        return http.client.HTTPSConnection("localhost", self.port, context=self.client_context, timeout=10)

    def post(self, body, content_type="application/json", path="/mutate", conn=None):
        conn = conn or self.connection()
        headers = {"Content-Type": content_type} if content_type else {}
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    hook = Webhook(tmp_path_factory.mktemp("webhook"))
    stop = threading.Event()
    thread = threading.Thread(
        target=run,
        args=(hook.settings, INJECTION, FileCertificates(hook.settings.cert_file, hook.settings.key_file), stop),
        daemon=True,
    )
    thread.start()
    wait_for(lambda: http_get(f"http://127.0.0.1:{hook.metrics_port}/metrics")[0] == 200)
    yield hook
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


def review(pod, uid="b1f9c8e2-0d2e-4c36-9d4b-1c2f3e4d5a6b"):
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": pod["metadata"].get("namespace", "default"),
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
                "object": pod,
                "dryRun": False,
            },
        }
    ).encode()


def admitted(webhook, pod, conn=None):
    status, body = webhook.post(review(pod), conn=conn)
    assert status == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is True and response["uid"] == "b1f9c8e2-0d2e-4c36-9d4b-1c2f3e4d5a6b"
    patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return apply(pod, patch), response


@pytest.mark.parametrize("name", ["pytorchjob-worker.yaml", "job-pod.yaml", "zero-code-pod.yaml", "cpu-pod.yaml"])
def test_a_realistic_pod_is_injected_over_https_and_reinjecting_changes_nothing(webhook, name):
    pod, response = admitted(webhook, fixture(name))
    assert response["patchType"] == "JSONPatch"
    validate(pod)
    again, second = admitted(webhook, pod)
    assert "patch" not in second and again == pod


def test_the_api_servers_kept_alive_connection_serves_many_reviews(webhook):
    conn = webhook.connection()
    for name in ("pytorchjob-worker.yaml", "job-pod.yaml", "cpu-pod.yaml"):
        admitted(webhook, fixture(name), conn=conn)
    conn.close()


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        (b"{}", "text/yaml", 415),
        (b"not json", "application/json", 400),
        (b'{"kind":"AdmissionReview"}', None, 415),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}', "application/json", 400),
    ],
)
def test_requests_that_are_not_admission_reviews_get_a_client_error(webhook, body, content_type, status):
    code, text = webhook.post(body, content_type)
    assert code == status and text.strip()


def test_a_huge_body_is_refused_by_its_length_before_it_is_read(webhook):
    sock = webhook.client_context.wrap_socket(
        socket.create_connection(("localhost", webhook.port)), server_hostname="localhost"
    )
    sock.sendall(
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50000000\r\n\r\n"
    )
    reply = sock.recv(4096).decode()
    sock.close()
    assert reply.startswith("HTTP/1.1 413") and "Connection: close" in reply


def test_a_missing_content_length_and_unknown_paths_are_answered_not_crashed(webhook):
    sock = webhook.client_context.wrap_socket(
        socket.create_connection(("localhost", webhook.port)), server_hostname="localhost"
    )
    sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n")
    assert sock.recv(4096).decode().startswith("HTTP/1.1 411")
    sock.close()
    assert webhook.post(b"{}", path="/elsewhere")[0] == 404
    conn = webhook.connection()
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200


def test_a_client_waiting_for_100_continue_gets_it_at_once_and_its_review_answered(webhook):
    body = review(fixture("cpu-pod.yaml"))
    raw = socket.create_connection(("localhost", webhook.port), timeout=5)
    with webhook.client_context.wrap_socket(raw, server_hostname="localhost") as sock:
        start = time.monotonic()
        head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")  # not held until the body would arrive
        assert time.monotonic() - start < as_this_machine_gives(1.0)
        sock.sendall(body)
        assert sock.recv(100).startswith(b"HTTP/1.1 200 OK")


def test_plain_http_on_the_tls_port_is_counted_and_the_server_carries_on(webhook):
    handshakes = _sample(webhook, 'oomsight_webhook_errors_total{component="tls_handshake"}')
    injected = _sample(webhook, 'oomsight_webhook_admissions_total{result="injected"}')
    with socket.create_connection(("127.0.0.1", webhook.port), timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(OSError):
            raw.recv(100)
    admitted(webhook, fixture("cpu-pod.yaml"))
    wait_for(lambda: _sample(webhook, 'oomsight_webhook_errors_total{component="tls_handshake"}') == handshakes + 1)
    assert _sample(webhook, 'oomsight_webhook_admissions_total{result="injected"}') == injected + 1


def test_a_renewed_certificate_file_is_served_without_a_restart(webhook):
    renewed = webhook.issue(datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1))

    def served_serial():
        with (
            socket.create_connection(("localhost", webhook.port)) as raw,
            webhook.client_context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            return tls.getpeercert(binary_form=True)

    from cryptography import x509

    wait_for(lambda: x509.load_der_x509_certificate(served_serial()).serial_number == renewed.certificate.serial_number)
    expiry = _sample(webhook, "oomsight_webhook_certificate_expiry_timestamp_seconds")
    assert expiry == renewed.not_after().timestamp()


def _sample(webhook, series):
    _, body = http_get(f"http://127.0.0.1:{webhook.metrics_port}/metrics")
    line = next(line for line in body.splitlines() if line.startswith(series + " "))
    return float(line.split()[-1])


def test_four_concurrent_huge_reviews_over_https_are_admitted_unchanged_within_a_small_peak(webhook):
    from test_webhook_limits import concurrently, pod_with, review_of, skipped_response

    body = review_of(pod_with(20_000))  # 1.3 MiB: over max_review_bytes, under max_body_bytes
    before = _sample(webhook, 'oomsight_webhook_admissions_total{result="skipped"}')
    statuses, peak = concurrently(4, lambda: webhook.post(body))
    assert len(statuses) == 4 and all(skipped_response(status, text) for status, text in statuses)
    assert peak < 24 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB (client and server together)"
    assert _sample(webhook, 'oomsight_webhook_admissions_total{result="skipped"}') == before + 4


@pytest.fixture
def strict_webhook(tmp_path):
    import dataclasses

    from oomsight_server.listener import ServerLimits

    hook = Webhook(tmp_path)
    limits = ServerLimits(max_connections=2, idle_timeout_seconds=5, request_timeout_seconds=1)
    hook.settings = dataclasses.replace(hook.settings, limits=limits)
    stop = threading.Event()
    source = FileCertificates(hook.settings.cert_file, hook.settings.key_file)
    thread = threading.Thread(target=run, args=(hook.settings, INJECTION, source, stop), daemon=True)
    thread.start()
    wait_for(lambda: http_get(f"http://127.0.0.1:{hook.metrics_port}/metrics")[0] == 200)
    yield hook
    stop.set()
    thread.join(10)


def test_a_trickled_body_is_cut_off_at_the_read_deadline(strict_webhook):
    sock = strict_webhook.client_context.wrap_socket(
        socket.create_connection(("localhost", strict_webhook.port)), server_hostname="localhost"
    )
    sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    sock.settimeout(0.3)
    start, cut = time.monotonic(), False
    while time.monotonic() - start < as_this_machine_gives(8) and not cut:
        try:
            sock.send(b" ")
            cut = sock.recv(100) == b""
        except TimeoutError:
            continue
        except (OSError, ssl.SSLError):
            cut = True
    sock.close()
    assert cut and time.monotonic() - start < as_this_machine_gives(4)
    wait_for(lambda: _sample(strict_webhook, 'oomsight_webhook_errors_total{component="deadline"}') >= 1)


def test_over_the_webhook_cap_the_oldest_silent_connection_is_closed_and_the_review_is_answered(strict_webhook):
    held = [socket.create_connection(("127.0.0.1", strict_webhook.port), timeout=5) for _ in range(2)]
    time.sleep(0.3)
    admitted(strict_webhook, fixture("cpu-pod.yaml"))  # a third connection, over the cap of 2
    assert closed_by_peer(held[0])
    for s in held:
        s.close()
    wait_for(lambda: _sample(strict_webhook, 'oomsight_webhook_errors_total{component="over_capacity"}') >= 1)


def closed_by_peer(sock):
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
