"""The fields of the webhook's server settings: one frozen dataclass, a docstring per field.

GENERATED from the tables of ``oomsight.config.variables`` by ``python -m
oomsight.config.rendering``: edit the table, not this file. Each field's docstring names its
variable (and flag). ``oomsight_webhook.settings`` extends the class with how it is read and
checked.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WebhookFields:
    """The admission webhook's server and TLS; the chart sets them (its deployment)."""

    host: str = "0.0.0.0"
    """Listen address of the HTTPS and metrics ports (``::`` for IPv6 and dual-stack; chart:
    ``webhook.listenAddress``) (``OOMSIGHT_WEBHOOK_HOST``; ``--host``)."""

    port: int = 21_443
    """HTTPS port (``POST /mutate``, ``GET /healthz``) the Service's port 443 forwards to (``OOMSIGHT_WEBHOOK_PORT``;
    ``--port``)."""

    metrics_port: int = 21_401
    """Plain-HTTP ``/metrics`` of the webhook itself; ``0`` turns it off (``OOMSIGHT_WEBHOOK_METRICS_PORT``)."""

    tls_mode: str = "self"
    """``self``: keep a CA and certificate in a Secret and patch ``caBundle``; ``files``: read
    ``OOMSIGHT_WEBHOOK_CERT_FILE``/``_KEY_FILE`` (cert-manager mounts them) and reload them when they change
    (``OOMSIGHT_WEBHOOK_TLS_MODE``; ``--tls-mode``)."""

    cert_file: str = "/etc/oomsight/tls/tls.crt"
    """Serving certificate (PEM) in ``files`` mode (``OOMSIGHT_WEBHOOK_CERT_FILE``)."""

    key_file: str = "/etc/oomsight/tls/tls.key"
    """Its private key (PEM) in ``files`` mode (``OOMSIGHT_WEBHOOK_KEY_FILE``)."""

    cert_dir: str = "/tmp/oomsight-webhook"
    """Where ``self`` mode writes the current certificate for the TLS library (an ``emptyDir``)
    (``OOMSIGHT_WEBHOOK_CERT_DIR``)."""

    namespace: str = ""
    """The webhook's namespace (downward API): where its Secret lives, part of its DNS name
    (``OOMSIGHT_WEBHOOK_NAMESPACE``)."""

    service: str = ""
    """The webhook's Service: the certificate is made for ``<service>.<namespace>.svc``
    (``OOMSIGHT_WEBHOOK_SERVICE``)."""

    secret: str = ""
    """``self`` mode: the Secret that holds the CA and the serving certificate (``OOMSIGHT_WEBHOOK_SECRET``)."""

    configuration: str = ""
    """``self`` mode: the MutatingWebhookConfiguration whose ``caBundle`` it keeps
    (``OOMSIGHT_WEBHOOK_CONFIGURATION``)."""

    tls_reconcile_seconds: float = 60.0
    """How often ``self`` mode re-checks the Secret (renewal) and ``caBundle`` (restored after an upgrade)
    (``OOMSIGHT_WEBHOOK_TLS_RECONCILE_SECONDS``)."""

    max_body_bytes: int = 4_194_304
    """Larger requests are refused (413) unread (the API server keeps objects under 3 MiB, so a real review is never
    this large) (``OOMSIGHT_WEBHOOK_MAX_BODY_BYTES``)."""

    max_review_bytes: int = 1_048_576
    """A larger review is not parsed: it is read through in 64 KiB chunks keeping only its head, and answered
    ``allowed`` without the sidecar, with a warning (fail-open,
    ``oomsight_webhook_admissions_total{result="skipped"}``) (``OOMSIGHT_WEBHOOK_MAX_REVIEW_BYTES``)."""

    max_containers: int = 500
    """A pod with more containers plus init containers is admitted unchanged with a warning (``skipped``)
    (``OOMSIGHT_WEBHOOK_MAX_CONTAINERS``)."""

    max_concurrent_reviews: int = 2
    """Reviews parsed and mutated at once (parsing holds the GIL: more buys memory, not speed); one that waits longer
    than half the request timeout is admitted unchanged (``skipped``)
    (``OOMSIGHT_WEBHOOK_MAX_CONCURRENT_REVIEWS``)."""
