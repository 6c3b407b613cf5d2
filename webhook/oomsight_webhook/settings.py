"""Webhook settings: one frozen dataclass, from ``OOMSIGHT_WEBHOOK_*`` variables and CLI flags."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping

from oomsight.config import ConfigError, env_setting, parse_count, parse_port, parse_seconds
from oomsight_sidecar.listener import ServerLimits
from oomsight_sidecar.settings import with_flags

ENV_WEBHOOK_HOST = "OOMSIGHT_WEBHOOK_HOST"
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
ENV_WEBHOOK_MAX_REVIEW = "OOMSIGHT_WEBHOOK_MAX_REVIEW_BYTES"
ENV_WEBHOOK_MAX_CONTAINERS = "OOMSIGHT_WEBHOOK_MAX_CONTAINERS"
ENV_WEBHOOK_MAX_REVIEWS = "OOMSIGHT_WEBHOOK_MAX_CONCURRENT_REVIEWS"
LIMITS_PREFIX = "OOMSIGHT_WEBHOOK"
MIB = 1024 * 1024
WORKERS = 4
"""Requests answered at once: bodies being read plus reviews parsed (docs/kubernetes.md)."""

WEBHOOK_PORT = 21443
WEBHOOK_METRICS_PORT = 21401
TLS_MODES = ("self", "files")


@dataclasses.dataclass(frozen=True)
class WebhookSettings:
    """The admission webhook's server and TLS; the chart sets them (``templates/deployment.yaml``)."""

    host: str = "0.0.0.0"
    """Listen address of the HTTPS and metrics servers (``::`` for every IPv6 and IPv4
    address, ``127.0.0.1`` behind a local proxy); the chart sets it from ``webhook.listenAddress``."""

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

    max_body_bytes: int = 4 * MIB
    """Larger bodies are refused (413) unread. The API server keeps objects under 3 MiB, so
    every real AdmissionReview fits and is answered by the fail-open limits below."""

    max_review_bytes: int = 1 * MIB
    """A review body larger than this is not parsed: it is answered ``allowed`` without the
    sidecar and with a warning (fail-open, counted as ``skipped``), its uid found by a scan."""

    max_containers: int = 500
    """A pod with more containers and init containers than this is admitted unchanged with a
    warning (``skipped``) instead of being mutated."""

    max_concurrent_reviews: int = 2
    """Reviews parsed and mutated at once; more wait (under their read deadline) for a turn.
    With the two limits above this bounds the webhook's memory (docs/kubernetes.md)."""

    limits: ServerLimits = dataclasses.field(
        default_factory=lambda: ServerLimits(
            max_connections=1024, workers=WORKERS, idle_timeout_seconds=30.0, request_timeout_seconds=10.0
        )
    )
    """Connections held, workers, idle timeout, the read deadline of a request (handshake, head,
    body) and head size (docs/kubernetes.md, "Server limits")."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> WebhookSettings:
        e = os.environ if env is None else env
        d = cls()
        values: dict[str, object] = {
            "host": (e.get(ENV_WEBHOOK_HOST) or d.host).strip(),
            "port": env_setting(e, ENV_WEBHOOK_PORT, parse_port, d.port),
            "metrics_port": env_setting(e, ENV_WEBHOOK_METRICS_PORT, parse_port, d.metrics_port),
            "tls_mode": e.get(ENV_WEBHOOK_TLS_MODE, d.tls_mode).strip(),
            "cert_file": e.get(ENV_WEBHOOK_CERT_FILE, d.cert_file),
            "key_file": e.get(ENV_WEBHOOK_KEY_FILE, d.key_file),
            "cert_dir": e.get(ENV_WEBHOOK_CERT_DIR, d.cert_dir),
            "namespace": e.get(ENV_WEBHOOK_NAMESPACE, d.namespace),
            "service": e.get(ENV_WEBHOOK_SERVICE, d.service),
            "secret": e.get(ENV_WEBHOOK_SECRET, d.secret),
            "configuration": e.get(ENV_WEBHOOK_CONFIGURATION, d.configuration),
            "tls_reconcile_seconds": env_setting(e, ENV_WEBHOOK_RECONCILE, parse_seconds, d.tls_reconcile_seconds),
            "max_body_bytes": env_setting(e, ENV_WEBHOOK_MAX_BODY, _bytes, d.max_body_bytes),
            "max_review_bytes": env_setting(e, ENV_WEBHOOK_MAX_REVIEW, _bytes, d.max_review_bytes),
            "max_containers": env_setting(e, ENV_WEBHOOK_MAX_CONTAINERS, parse_count, d.max_containers),
            "max_concurrent_reviews": env_setting(e, ENV_WEBHOOK_MAX_REVIEWS, _reviews, d.max_concurrent_reviews),
            "limits": ServerLimits.from_env(e, LIMITS_PREFIX, d.limits),
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
        if not self.host or any(c.isspace() or c in "/[]" for c in self.host):
            raise ConfigError(f"{ENV_WEBHOOK_HOST}={self.host!r} is not a listen address (an IP or host name)")
        for name, port in (("port", self.port), ("metrics_port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ConfigError(f"webhook {name} {port} is not a TCP port")
        if self.tls_reconcile_seconds <= 0 or self.max_body_bytes <= 0:
            raise ConfigError(f"{ENV_WEBHOOK_RECONCILE} and {ENV_WEBHOOK_MAX_BODY} must be positive")
        if self.max_review_bytes > self.max_body_bytes:
            raise ConfigError(f"{ENV_WEBHOOK_MAX_REVIEW} must not be above {ENV_WEBHOOK_MAX_BODY}")


_bytes = functools.partial(parse_count, minimum=1024, maximum=64 * MIB)
_reviews = functools.partial(parse_count, maximum=64)
