"""``oomsight sidecar``: serve a spool directory until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Optional

from prometheus_client import CollectorRegistry

from oomsight.collector import SpoolCollector
from oomsight.config import ConfigError
from oomsight_sidecar.admin import AdminApp, AdminSettings
from oomsight_sidecar.config import SidecarSettings
from oomsight_sidecar.server import MetricsApp, serve

logger = logging.getLogger(__name__)


def build_app(settings: SidecarSettings) -> MetricsApp:
    collector = SpoolCollector(
        settings.spool_dir,
        retention_seconds=settings.retention_seconds,
        stale_after_seconds=settings.stale_after_seconds,
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return MetricsApp(collector, registry)


def run(
    settings: SidecarSettings, stop: Optional[threading.Event] = None, admin: Optional[AdminSettings] = None
) -> int:
    stop = stop or threading.Event()
    app = build_app(settings)
    server = serve(app, settings.host, settings.port)
    admin_server = None
    if admin is not None and admin.port:
        admin_server = serve(AdminApp(settings.spool_dir, admin.token), admin.host, admin.port)
        logger.info("oomsight sidecar: admin endpoint on http://%s:%d/admin/", admin.host, admin_server.server_port)
    logger.info(
        "oomsight sidecar: serving %s on http://%s:%d/metrics",
        settings.spool_dir,
        settings.host,
        server.server_port,
    )
    if not app.check_ready():
        logger.warning(
            "oomsight sidecar: spool %s not readable yet; /readyz answers 503 until it is", settings.spool_dir
        )
    stop.wait()
    if settings.drain_seconds:
        logger.info("oomsight sidecar: draining for %.0f s so Prometheus gets a last scrape", settings.drain_seconds)
        threading.Event().wait(settings.drain_seconds)
    for srv in (server, admin_server):
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    return 0


def main(flags: dict[str, Any]) -> int:
    try:
        settings = SidecarSettings.from_env(**flags)
        admin = AdminSettings.from_env()
    except ConfigError as exc:
        logger.error("oomsight sidecar: invalid configuration: %s", exc)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(settings, stop, admin)
