"""Self-managed webhook TLS: a CA and serving certificate kept in a Secret, the CA kept in
the webhook configuration's caBundle; renewal, replica races and upgrades that wipe it."""

import base64
import datetime
import os
import socket
import ssl
import threading

import pytest
from cryptography import x509

from oomsight_server.kube import KubeError
from oomsight_webhook.certs import make_ca, make_serving, needs_renewal, service_dns_names, signed_by
from oomsight_webhook.main import resolve_native_sidecar
from oomsight_webhook.settings import WebhookSettings
from oomsight_webhook.tls import SelfManagedCertificates, ServerContext

from kubetools import FakeKube, kube_stub

SETTINGS = WebhookSettings(
    namespace="oomsight", service="oomsight-webhook", secret="oomsight-webhook-tls", configuration="oomsight"
)
NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)


def cluster():
    kube = FakeKube()
    kube.configs["oomsight"] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "oomsight"},
        "webhooks": [{"name": "pod-inject.oomsight.io", "clientConfig": {"service": {"name": "oomsight-webhook"}}}],
    }
    return kube


def manager(kube, now=NOW):
    return SelfManagedCertificates(kube, SETTINGS, clock=lambda: now)


def ca_bundle(kube):
    return base64.b64decode(kube.configs["oomsight"]["webhooks"][0]["clientConfig"]["caBundle"])


def test_the_first_start_creates_the_secret_and_fills_the_ca_bundle():
    kube = cluster()
    serving = manager(kube).current()
    secret = kube.secrets[("oomsight", "oomsight-webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert base64.b64decode(secret["data"]["tls.crt"]) == serving.cert_pem
    assert ca_bundle(kube) == base64.b64decode(secret["data"]["ca.crt"])
    names = serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "oomsight-webhook.oomsight.svc" in names.get_values_for_type(x509.DNSName)
    assert kube.names() == ["read_secret", "create_secret", "read_webhook_configuration", "patch_webhook_configuration"]


def test_a_second_replica_or_restart_reuses_everything_and_writes_nothing():
    kube = cluster()
    first = manager(kube).current()
    kube.calls.clear()
    assert manager(kube).current() == first
    assert kube.names() == ["read_secret", "read_webhook_configuration"]


def test_the_serving_certificate_is_renewed_a_month_before_expiry_with_the_same_ca():
    kube = cluster()
    first = manager(kube).current()
    bundle = ca_bundle(kube)
    kube.calls.clear()
    later = NOW + datetime.timedelta(days=340)
    renewed = manager(kube, later).current()
    assert renewed != first and not needs_renewal(renewed, later, datetime.timedelta(days=30))
    assert ca_bundle(kube) == bundle  # nothing for the API server to re-learn
    assert kube.names() == ["read_secret", "replace_secret", "read_webhook_configuration"]


def test_when_another_replica_creates_the_secret_first_its_certificate_is_used():
    kube, elsewhere = cluster(), cluster()
    theirs = manager(elsewhere).current()  # made by "another replica" ...
    kube.fail["create_secret"] = [KubeError(409, "secrets oomsight-webhook-tls already exists")]
    real_read, reads = kube.read_secret, []

    def racing_read(namespace, name):
        reads.append(name)
        if len(reads) == 2:  # ... and stored between our read and our create
            kube.secrets[(namespace, name)] = elsewhere.secrets[(namespace, name)]
        return real_read(namespace, name)

    kube.read_secret = racing_read
    assert manager(kube).current() == theirs
    assert kube.names().count("create_secret") == 1 and "replace_secret" not in kube.names()


def test_a_ca_bundle_wiped_by_an_upgrade_is_restored_on_the_next_reconcile():
    kube = cluster()
    manager(kube).current()
    bundle = ca_bundle(kube)
    del kube.configs["oomsight"]["webhooks"][0]["clientConfig"]["caBundle"]
    manager(kube).current()
    assert ca_bundle(kube) == bundle


def test_a_secret_with_garbage_in_it_is_replaced():
    kube = cluster()
    kube.secrets[("oomsight", "oomsight-webhook-tls")] = {
        "metadata": {"name": "oomsight-webhook-tls", "resourceVersion": "3"},
        "data": {"ca.crt": "bm90IGEgY2VydA==", "ca.key": "!!", "tls.crt": "", "tls.key": ""},
    }
    serving = manager(kube).current()
    ca = base64.b64decode(kube.secrets[("oomsight", "oomsight-webhook-tls")]["data"]["ca.crt"])
    assert serving.certificate.issuer == x509.load_pem_x509_certificate(ca).subject


def test_api_errors_propagate_so_the_reconciler_counts_them():
    kube = cluster()
    kube.fail["read_secret"] = [KubeError(403, "secrets is forbidden")]
    with pytest.raises(KubeError):
        manager(kube).current()


def test_the_serving_certificate_verifies_for_the_service_name_in_a_real_handshake(tmp_path):
    ca = make_ca("test-ca", NOW)
    now = datetime.datetime.now(datetime.timezone.utc)
    serving = make_serving(ca, [*service_dns_names("svc", "ns"), "127.0.0.1"], now)
    assert signed_by(serving, ca) and not signed_by(serving, make_ca("other", NOW))
    ctx = ServerContext(str(tmp_path / "certs"))
    assert ctx.load(serving) is True and ctx.load(serving) is False
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept():
            conn, _ = listener.accept()
            with ctx.context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

        t = threading.Thread(target=accept)
        t.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client.wrap_socket(raw, server_hostname="svc.ns.svc") as tls,
        ):
            tls.send(b"x")
            assert tls.getpeercert()["subject"][0][0][1] == "svc"
        t.join(5)


def test_the_real_client_makes_exactly_these_tls_requests():
    with kube_stub(
        {
            ("GET", r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/oomsight"): (
                200,
                cluster().configs["oomsight"],
            )
        }
    ) as (client, stub):
        SelfManagedCertificates(client, SETTINGS, clock=lambda: NOW).current()
    seen = [(r["method"], r["path"]) for r in stub.requests]
    assert seen == [
        ("GET", "/api/v1/namespaces/oomsight/secrets/oomsight-webhook-tls"),
        ("POST", "/api/v1/namespaces/oomsight/secrets"),
        ("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/oomsight"),
        ("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/oomsight"),
    ]
    assert stub.requests[3]["content_type"] == "application/json-patch+json"
    assert stub.requests[3]["body"][0] == {"op": "test", "path": "/webhooks/0/name", "value": "pod-inject.oomsight.io"}


@pytest.mark.parametrize(
    "mode, version, hint, expected",
    [
        ("true", "v1.27.3", "", True),
        ("false", "v1.33.0", "", False),
        ("auto", "v1.29.0-gke.1", "", True),
        ("auto", "v1.28.9", "v1.33.0", False),
        ("auto", None, "v1.27.0", False),
        ("auto", None, "v1.30.1", True),
        ("auto", None, "", False),
    ],
)
def test_native_sidecars_follow_the_mode_then_the_server_version_then_the_charts_hint(mode, version, hint, expected):
    kube = FakeKube(version=version or "")
    if version is None:
        kube.fail["server_version"] = [KubeError(0, "connection refused")]
    assert resolve_native_sidecar(mode, kube, hint) is expected


def test_a_failing_certificate_source_is_counted_logged_once_and_the_old_certificate_kept(tmp_path, caplog):
    from oomsight_webhook.main import Reconciler

    kube = cluster()
    context = ServerContext(str(tmp_path / "certs"))
    reconciler = Reconciler(manager(kube), context)
    assert reconciler.reconcile() is True
    loaded = context.loaded
    kube.fail["read_secret"] = [KubeError(0, "connection refused")] * 3
    with caplog.at_level("WARNING"):
        assert [reconciler.reconcile() for _ in range(3)] == [False, False, False]
    assert reconciler.failures == 3 and context.loaded == loaded
    assert sum("certificate not refreshed" in r.getMessage() for r in caplog.records) == 1
    assert reconciler.reconcile() is True  # the API is back


def test_the_private_key_is_created_0600_and_never_depends_on_a_later_chmod(tmp_path, monkeypatch):
    import oomsight_webhook.tls as tls

    calls = []
    monkeypatch.setattr(tls.os, "chmod", lambda *args, **kw: calls.append(args))  # as if a crash came before it
    monkeypatch.setattr(tls.os, "fchmod", lambda *args, **kw: calls.append(args), raising=False)
    old = os.umask(0o022)
    try:
        ctx = ServerContext(str(tmp_path / "certs"))
        ctx.load(make_serving(make_ca("test-ca", NOW), ["svc"], datetime.datetime.now(datetime.timezone.utc)))
    finally:
        os.umask(old)
    key = tmp_path / "certs" / "tls.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert [p for p in os.listdir(tmp_path / "certs") if "tmp" in p] == []
