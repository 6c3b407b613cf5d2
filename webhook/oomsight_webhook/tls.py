"""Where the webhook's serving certificate comes from, and keeping it fresh.

``files`` (cert-manager): cert-manager writes ``tls.crt``/``tls.key`` into a mounted
Secret and its cainjector fills ``caBundle``; the webhook only reloads the files when
they change.

``self`` (default): the webhook keeps a CA and a serving certificate in a Secret of its
own namespace and writes the CA into the ``caBundle`` of its MutatingWebhookConfiguration.
Every replica runs the same idempotent reconcile; creating and replacing the Secret use
the API server's optimistic concurrency (409 means another replica won: use its copy),
so there is no leader election. Nothing random is in the chart, so ``helm upgrade`` and
GitOps syncs never re-key (unlike Helm's ``genCA``).
"""

from __future__ import annotations

import base64
import datetime
import os
import ssl
import threading
from typing import Any, Callable, Optional, Protocol

from oomsight.wire.spool import write_atomic
from oomsight_server.kube import Json, KubeApi, KubeError
from oomsight_webhook.certs import KeyPair, covers, make_ca, make_serving, needs_renewal, service_dns_names, signed_by
from oomsight_webhook.settings import WebhookSettings

RENEW_BEFORE = datetime.timedelta(days=30)
CA_KEYS = ("ca.crt", "ca.key")
SERVING_KEYS = ("tls.crt", "tls.key")
MAX_RACE_ROUNDS = 3

Clock = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class CertificateSource(Protocol):
    def current(self) -> KeyPair:
        """The serving certificate to use now, renewed or reloaded if needed."""
        ...


class FileCertificates:
    """Reads the certificate files that cert-manager keeps up to date."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file

    def current(self) -> KeyPair:
        with open(self.cert_file, "rb") as cert, open(self.key_file, "rb") as key:
            return KeyPair(cert.read(), key.read())


class SelfManagedCertificates:
    """Keeps CA + serving certificate in a Secret and the CA in the webhook's ``caBundle``."""

    def __init__(self, client: KubeApi, settings: WebhookSettings, clock: Clock = utc_now) -> None:
        self.client = client
        self.settings = settings
        self.clock = clock
        self.dns_names = service_dns_names(settings.service, settings.namespace)

    def current(self) -> KeyPair:
        ca, serving = self._ensure_secret()
        self._ensure_ca_bundle(ca)
        return serving

    def _ensure_secret(self) -> tuple[KeyPair, KeyPair]:
        s = self.settings
        for _ in range(MAX_RACE_ROUNDS):
            secret = self.client.read_secret(s.namespace, s.secret)
            ca, serving = _pairs(secret)
            fresh_ca, fresh_serving = self._renewed(ca, serving)
            if (fresh_ca, fresh_serving) == (ca, serving):
                return fresh_ca, fresh_serving
            body = self._secret_body(fresh_ca, fresh_serving, secret)
            try:
                if secret is None:
                    self.client.create_secret(s.namespace, body)
                else:
                    self.client.replace_secret(s.namespace, s.secret, body)
                return fresh_ca, fresh_serving
            except KubeError as exc:
                if exc.status != 409:  # 409: another replica wrote first; read its certificate
                    raise
        raise KubeError(409, f"Secret {s.namespace}/{s.secret} kept changing under us")

    def _renewed(self, ca: Optional[KeyPair], serving: Optional[KeyPair]) -> tuple[KeyPair, KeyPair]:
        now = self.clock()
        if ca is None or needs_renewal(ca, now, RENEW_BEFORE):
            ca = make_ca(f"oomsight-webhook-ca.{self.settings.namespace}", now)
            serving = None
        ok = (
            serving is not None
            and not needs_renewal(serving, now, RENEW_BEFORE)
            and signed_by(serving, ca)
            and covers(serving, self.dns_names)
        )
        if not ok or serving is None:
            serving = make_serving(ca, self.dns_names, now)
        return ca, serving

    def _secret_body(self, ca: KeyPair, serving: KeyPair, existing: Optional[Json]) -> Json:
        meta: Json = {
            "name": self.settings.secret,
            "namespace": self.settings.namespace,
            "labels": {"app.kubernetes.io/managed-by": "oomsight-webhook"},
        }
        if existing is not None:
            meta["resourceVersion"] = existing.get("metadata", {}).get("resourceVersion", "")
        data = {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem, "tls.crt": serving.cert_pem, "tls.key": serving.key_pem}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }

    def _ensure_ca_bundle(self, ca: KeyPair) -> None:
        """Patch every webhook of our configuration whose ``caBundle`` is not our CA."""
        name = self.settings.configuration
        bundle = base64.b64encode(ca.cert_pem).decode()
        config = self.client.read_webhook_configuration(name)
        patch: list[Json] = []
        for i, hook in enumerate(config.get("webhooks") or []):
            client_config = hook.get("clientConfig") or {}
            if client_config.get("caBundle") != bundle:
                patch.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
                patch.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle})
        if patch:
            self.client.patch_webhook_configuration(name, patch)


def _pairs(secret: Optional[Json]) -> tuple[Optional[KeyPair], Optional[KeyPair]]:
    data: Any = (secret or {}).get("data") or {}
    try:
        raw = {k: base64.b64decode(data[k]) for k in (*CA_KEYS, *SERVING_KEYS) if k in data}
    except (ValueError, TypeError):
        return None, None
    ca = KeyPair(raw["ca.crt"], raw["ca.key"]) if all(k in raw for k in CA_KEYS) else None
    serving = KeyPair(raw["tls.crt"], raw["tls.key"]) if all(k in raw for k in SERVING_KEYS) else None
    return ca, serving


def write_private(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` in a file created 0600 (never readable by others, not
    even between its creation and a chmod), then renamed into place."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


class ServerContext:
    """An ``ssl.SSLContext`` whose certificate can be swapped while the server runs."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loaded: Optional[KeyPair] = None

    def load(self, pair: KeyPair) -> bool:
        """Use ``pair`` for new connections; False if it is the one already loaded."""
        if pair == self.loaded:
            return False
        os.makedirs(self.folder, mode=0o700, exist_ok=True)
        cert, key = os.path.join(self.folder, "tls.crt"), os.path.join(self.folder, "tls.key")
        write_atomic(cert, pair.cert_pem, durable=False)
        write_private(key, pair.key_pem)
        self.context.load_cert_chain(cert, key)  # raises ssl.SSLError if they do not match
        self.loaded = pair
        return True
