"""Webhook settings: one frozen dataclass, from ``OOMSIGHT_WEBHOOK_*`` variables and CLI flags."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from oomsight.config import ConfigError
from oomsight_sidecar.settings import number_env, with_flags

ENV_WEBHOOK_PORT = "OOMSIGHT_WEBHOOK_PORT"
ENV_WEBHOOK_METRICS_PORT = "OOMSIGHT_WEBHOOK_METRICS_PORT"
ENV_WEBHOOK_TLS_MODE = "OOMSIGHT_WEBHOOK_TLS_MODE"
ENV_WEBHOOK_CERT_FILE = "OOMSIGHT_WEBHOOK_CERT_FILE"
ENV_WEBHOOK_KEY_FILE = "OOMSIGHT_WEBHOOK_KEY_FILE"
ENV_WEBHOOK_CERT_DIR = "OOMSIGHT_WEBHOOK_CERT_DIR"
ENV_WEBHOOK_NAMESPACE = "OOMSIGHT_WEBHOOK_NAMESPACE"
ENV_WEBHOOK_SERVICE = "OOMSIGHT_WEBHOOK_SERVICE"
ENV_WEBHOOK_SECRET = "OOMSIGHT_WEBHOOK_SECRET"
ENV_WEBHOOK_CONFIGURATION = "OOMSIGHT_WEBHOOK_CONFIGURATION"
ENV_WEBHOOK_RECONCILE = "OOMSIGHT_WEBHOOK_TLS_RECONCILE_SECONDS"
ENV_WEBHOOK_MAX_BODY = "OOMSIGHT_WEBHOOK_MAX_BODY_BYTES"

WEBHOOK_PORT = 21443
WEBHOOK_METRICS_PORT = 21401
TLS_MODES = ("self", "files")


@dataclasses.dataclass(frozen=True)
class WebhookSettings:
    """The admission webhook's server and TLS; the chart sets them (``templates/deployment.yaml``)."""

    host: str = "0.0.0.0"
    """Listen address of the HTTPS and metrics servers."""

    port: int = WEBHOOK_PORT
    """HTTPS port the Service's port 443 forwards to."""

    metrics_port: int = WEBHOOK_METRICS_PORT
    """Plain-HTTP port of the webhook's own ``/metrics``; 0 turns it off."""

    tls_mode: str = "self"
    """``self``: the webhook keeps its certificate in a Secret and patches ``caBundle``;
    ``files``: read ``cert_file``/``key_file`` (cert-manager mounts them) and reload on change."""

    cert_file: str = "/etc/oomsight/tls/tls.crt"
    """Serving certificate (PEM) in ``files`` mode."""

    key_file: str = "/etc/oomsight/tls/tls.key"
    """Its private key (PEM) in ``files`` mode."""

    cert_dir: str = "/tmp/oomsight-webhook"
    """Where ``self`` mode writes the current certificate for the TLS library (an emptyDir)."""

    namespace: str = ""
    """The webhook's namespace (downward API): where its Secret lives, part of its DNS name."""

    service: str = ""
    """Name of the webhook's Service: the certificate is made for ``<service>.<namespace>.svc``."""

    secret: str = ""
    """Name of the Secret that holds the CA and serving certificate in ``self`` mode."""

    configuration: str = ""
    """Name of the MutatingWebhookConfiguration whose ``caBundle`` ``self`` mode keeps."""

    tls_reconcile_seconds: float = 60.0
    """How often ``self`` mode re-checks the Secret (renewal) and ``caBundle`` (restored after an upgrade)."""

    max_body_bytes: int = 4 * 1024 * 1024
    """Larger AdmissionReview bodies are refused (413) unread."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> WebhookSettings:
        e = os.environ if env is None else env
        d = cls()
        values: dict[str, object] = {
            "port": number_env(e, ENV_WEBHOOK_PORT, d.port, int),
            "metrics_port": number_env(e, ENV_WEBHOOK_METRICS_PORT, d.metrics_port, int),
            "tls_mode": e.get(ENV_WEBHOOK_TLS_MODE, d.tls_mode).strip(),
            "cert_file": e.get(ENV_WEBHOOK_CERT_FILE, d.cert_file),
            "key_file": e.get(ENV_WEBHOOK_KEY_FILE, d.key_file),
            "cert_dir": e.get(ENV_WEBHOOK_CERT_DIR, d.cert_dir),
            "namespace": e.get(ENV_WEBHOOK_NAMESPACE, d.namespace),
            "service": e.get(ENV_WEBHOOK_SERVICE, d.service),
            "secret": e.get(ENV_WEBHOOK_SECRET, d.secret),
            "configuration": e.get(ENV_WEBHOOK_CONFIGURATION, d.configuration),
            "tls_reconcile_seconds": number_env(e, ENV_WEBHOOK_RECONCILE, d.tls_reconcile_seconds, float),
            "max_body_bytes": number_env(e, ENV_WEBHOOK_MAX_BODY, d.max_body_bytes, int),
        }
        return with_flags(cls, values, flags)

    def validate(self) -> None:
        if self.tls_mode not in TLS_MODES:
            raise ConfigError(f"{ENV_WEBHOOK_TLS_MODE}={self.tls_mode!r} must be one of {', '.join(TLS_MODES)}")
        missing = [
            env
            for env, value in (
                (ENV_WEBHOOK_NAMESPACE, self.namespace),
                (ENV_WEBHOOK_SERVICE, self.service),
                (ENV_WEBHOOK_SECRET, self.secret),
                (ENV_WEBHOOK_CONFIGURATION, self.configuration),
            )
            if not value
        ]
        if self.tls_mode == "self" and missing:
            raise ConfigError(f"TLS mode 'self' needs {', '.join(missing)}")
        for name, port in (("port", self.port), ("metrics_port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ConfigError(f"webhook {name} {port} is not a TCP port")
        if self.tls_reconcile_seconds <= 0 or self.max_body_bytes <= 0:
            raise ConfigError(f"{ENV_WEBHOOK_RECONCILE} and {ENV_WEBHOOK_MAX_BODY} must be positive")
