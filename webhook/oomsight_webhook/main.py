"""``oomsight webhook``: the sidecar-injecting admission webhook, until SIGTERM.

Start-up: settings from ``OOMSIGHT_WEBHOOK_*`` / ``OOMSIGHT_INJECT_*``; native sidecars
decided once (``docs/kubernetes.md``, "Native sidecars"); a serving certificate obtained
(retrying while the API server is not reachable); then HTTPS on the webhook port and
plain ``/metrics`` on the metrics port. A reconcile loop renews or reloads the
certificate and restores ``caBundle`` (``self`` mode) every ``tls_reconcile_seconds``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from oomsight.config import ConfigError
from oomsight_server.counter import labelled_counter
from oomsight_server.kube import KubeApi, KubeClient
from oomsight_server.wsgi import serve as serve_wsgi
from oomsight_server.wsgi import stop as stop_server
from oomsight_webhook.admission import RESULTS, Admitter, ReviewLimits
from oomsight_webhook.injection import ENV_NATIVE, InjectionSettings, native_sidecars_supported
from oomsight_webhook.server import AdmissionServer, serve
from oomsight_webhook.settings import WebhookSettings
from oomsight_webhook.tls import CertificateSource, FileCertificates, SelfManagedCertificates, ServerContext

logger = logging.getLogger(__name__)

ERROR_COMPONENTS = ("tls_reconcile", "tls_handshake", "request", "over_capacity", "out_of_descriptors", "deadline")


class Reconciler:
    """Fetches the current certificate and loads it; counts and logs (once per message) failures."""

    def __init__(self, source: CertificateSource, context: ServerContext) -> None:
        self.source = source
        self.context = context
        self.failures = 0
        self._last_error = ""

    def reconcile(self) -> bool:
        try:
            pair = self.source.current()
            if self.context.load(pair):
                logger.info("oomsight webhook: serving certificate valid until %s", pair.not_after().isoformat())
        except Exception as exc:  # API errors, unreadable files, a key that does not match: keep the old one
            self.failures += 1
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                logger.warning("oomsight webhook: certificate not refreshed (%s); retrying", exc)
            return False
        self._last_error = ""
        return True


class WebhookCollector(Collector):
    def __init__(self, admitter: Admitter, reconciler: Reconciler, server: Optional[AdmissionServer]) -> None:
        self.admitter = admitter
        self.reconciler = reconciler
        self.server = server

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        counts = self.admitter.counts()
        yield labelled_counter(
            "oomsight_webhook_admissions",
            "Admission requests by result: injected, unchanged (not a pod CREATE, or nothing to add), "
            "rejected (not an AdmissionReview), error (a bug; the pod was admitted unchanged).",
            "result",
            {result: counts.get(result, 0) for result in RESULTS},
        )
        served = self.server.errors.counts() if self.server is not None else {}
        errors = {c: served.get(c, 0) for c in ERROR_COMPONENTS} | {"tls_reconcile": self.reconciler.failures}
        yield labelled_counter(
            "oomsight_webhook_errors",
            "Errors the webhook caught and carried on from, by component: over_capacity (a connection "
            "over the cap, closed), out_of_descriptors (accept failed at the descriptor limit), deadline "
            "(a request cut off at its read deadline).",
            "component",
            errors,
        )
        loaded = self.reconciler.context.loaded
        if loaded is not None:
            expiry = GaugeMetricFamily(
                "oomsight_webhook_certificate_expiry_timestamp_seconds",
                "Unix time when the serving certificate in use expires.",
                unit="seconds",
            )
            expiry.add_metric([], loaded.not_after().timestamp())
            yield expiry


def resolve_native_sidecar(mode: str, client: Optional[KubeApi], hint: str) -> bool:
    """``true``/``false`` as given; ``auto``: the API server's version, else the chart's render-time hint."""
    mode = mode.strip().lower() or "auto"
    if mode in ("true", "false"):
        return mode == "true"
    if mode != "auto":
        raise ConfigError(f"{ENV_NATIVE}={mode!r} must be auto, true or false")
    version = ""
    if client is not None:
        try:
            version = client.server_version()
        except Exception as exc:
            logger.warning("oomsight webhook: cannot read the server version (%s); using the chart's %r", exc, hint)
    supported = native_sidecars_supported(version or hint)
    if supported is None:
        logger.warning("oomsight webhook: Kubernetes version unknown; injecting regular sidecar containers")
        return False
    logger.info("oomsight webhook: Kubernetes %s: native sidecars %s", version or hint, "on" if supported else "off")
    return supported


def run(
    settings: WebhookSettings,
    injection: InjectionSettings,
    source: CertificateSource,
    stop: threading.Event,
) -> int:
    context = ServerContext(settings.cert_dir)
    reconciler = Reconciler(source, context)
    while not reconciler.reconcile():
        if stop.wait(min(5.0, settings.tls_reconcile_seconds)):
            return 1
    admitter = Admitter(injection, review_limits(settings))
    with _naming_the_port(settings.host, settings.port):
        server = AdmissionServer((settings.host, settings.port), context.context, admitter, settings.limits)
    serve(server)
    metrics = None
    if settings.metrics_port:
        registry = CollectorRegistry()
        registry.register(WebhookCollector(admitter, reconciler, server))
        with _naming_the_port(settings.host, settings.metrics_port):
            metrics = serve_wsgi(make_wsgi_app(registry), settings.host, settings.metrics_port, settings.limits)
    logger.info("oomsight webhook: serving https://%s:%d/mutate", settings.host, server.server_address[1])
    due = time.monotonic() + settings.tls_reconcile_seconds
    while not stop.wait(min(0.5, settings.tls_reconcile_seconds)):  # short waits: SIGTERM is seen at once
        if time.monotonic() >= due:
            reconciler.reconcile()
            due = time.monotonic() + settings.tls_reconcile_seconds
    server.shutdown()
    server.server_close()
    server.close_limits()
    if metrics is not None:
        stop_server(metrics)
    return 0


def review_limits(settings: WebhookSettings) -> ReviewLimits:
    """The admitter's limits: a review waits for a turn at most half its read deadline."""
    return ReviewLimits(
        max_body_bytes=settings.max_body_bytes,
        max_review_bytes=settings.max_review_bytes,
        max_containers=settings.max_containers,
        max_concurrent=settings.max_concurrent_reviews,
        wait_seconds=settings.limits.request_timeout_seconds / 2,
    )


def main(
    flags: dict[str, Any],
    env: Optional[Mapping[str, str]] = None,
    client_factory: Callable[[], KubeApi] = KubeClient.in_cluster,
) -> int:
    e = os.environ if env is None else env
    try:
        settings = WebhookSettings.from_env(e, **flags)
        client = _client(client_factory, required=settings.tls_mode == "self")
        mode, hint = InjectionSettings.native_mode(e)
        native = resolve_native_sidecar(mode, client, hint)
        injection = InjectionSettings.from_env(e, native_sidecar=native)
    except ConfigError as exc:
        logger.error("oomsight webhook: invalid configuration: %s", exc)
        return 2
    source: CertificateSource
    if settings.tls_mode == "self" and client is not None:
        source = SelfManagedCertificates(client, settings)
    else:
        source = FileCertificates(settings.cert_file, settings.key_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(settings, injection, source, stop)


def _client(factory: Callable[[], KubeApi], required: bool) -> Optional[KubeApi]:
    try:
        return factory()
    except Exception as exc:
        if required:
            raise ConfigError(f"TLS mode 'self' needs the Kubernetes API ({exc})") from None
        logger.info("oomsight webhook: no Kubernetes API (%s)", exc)
        return None


@contextlib.contextmanager
def _naming_the_port(host: str, port: int) -> Iterator[None]:
    """A port that cannot be bound (taken) is named in the error: the command line says which."""
    try:
        yield
    except OSError as exc:
        exc.filename = f"{port} on {host}"
        raise
