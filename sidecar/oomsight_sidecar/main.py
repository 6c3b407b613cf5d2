"""``oomsight sidecar``: serve a spool directory until SIGTERM; post OOM Events in a pod."""

from __future__ import annotations

import gc
import logging
import os
import signal
import stat
import threading
from typing import Any, Callable, Optional
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry

from oomsight.config import ConfigError
from oomsight.config.variables import BY_KEYWORD
from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.spool import TEMP_MAX_AGE_SECONDS, SpoolReader
from oomsight_server.kube import KubeApi, KubeClient
from oomsight_server.listener import ServerErrors
from oomsight_server.owner import pod_owner
from oomsight_server.wsgi import serve
from oomsight_server.wsgi import stop as stop_server
from oomsight_sidecar.admin import AdminApp, ensure_token
from oomsight_sidecar.claims import ClaimCollector, ClaimReader, start_refresh
from oomsight_sidecar.events import STATE_DIR, EventPoster
from oomsight_sidecar.heap import one_arena
from oomsight_sidecar.kubemetrics import KubernetesCollector
from oomsight_sidecar.server import CollectWatch, MetricsApp, ServerCollector
from oomsight_sidecar.settings import AdminSettings, KubernetesSettings, SidecarSettings

logger = logging.getLogger(__name__)

LEDGER_FILE = "oom-ledger.json"
"""The OOM counters' ledger (``oomsight.metrics.ledger``), in the spool's ``sidecar/`` folder: a restarted
sidecar's counters go on from where they were."""
GC_THRESHOLD = (50_000, 20, 10)
"""CPython's collection thresholds in the sidecar process (CPython's default: 700, 10, 10).
A scrape keeps every snapshot it parses, some 300 container objects each (the step rows are
lists): with the default, the young collections of one 1,000-rank scrape re-scan them dozens
of times and a full collection walks every kept document once or twice a scrape, half the
scrape's time (``benchmarks/bench_reader_scale.py``, docs/testing.md). The spool's documents
hold no reference cycles (reference counting frees them), so collecting less often only delays
freeing the rare cyclic garbage, by at most 50,000 allocations."""


def build_app(
    settings: SidecarSettings,
    kube: Optional[KubernetesCollector] = None,
    errors: Optional[ServerErrors] = None,
    claims: Optional[ClaimReader] = None,
) -> MetricsApp:
    collector = SpoolCollector(
        settings.spool_dir,
        retention_seconds=settings.retention_seconds,
        stale_after_seconds=settings.stale_after_seconds,
        reader=SpoolReader(settings.spool_dir, sweep_temp_after_seconds=TEMP_MAX_AGE_SECONDS),
        ledger_path=os.path.join(settings.spool_dir, STATE_DIR, LEDGER_FILE),
    )
    others = CollectorRegistry()
    if kube is not None:
        others.register(kube)
    if errors is not None:
        others.register(ServerCollector(errors))
    if claims is not None:
        others.register(ClaimCollector(claims))
    return MetricsApp(collector, others, CollectWatch(settings.hung_after_seconds))


SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
"""Set by Kubernetes in every container of a pod: where the API server is."""


def in_cluster_client() -> KubeApi:
    """``KubeClient.in_cluster`` where Kubernetes named its API server (:data:`SERVICE_HOST`); elsewhere it fails
    before the kubernetes package is imported: a failed attempt kept its 42 MiB for the sidecar's life (issue 49).
    So does ``KubeClient.in_cluster`` where the pod has no service account token."""
    if not os.environ.get(SERVICE_HOST):
        raise RuntimeError(f"not in a Kubernetes pod: {SERVICE_HOST} is not set")
    return KubeClient.in_cluster()


def build_poster(
    settings: SidecarSettings, kube: KubernetesSettings, client_factory: Callable[[], KubeApi]
) -> Optional[EventPoster]:
    """The Event poster, when Events are on and the pod's identity is known."""
    if not kube.events:
        return None
    if not kube.in_pod:
        if kube.pod_name or kube.pod_namespace:
            logger.warning("oomsight sidecar: pod name, namespace and uid are all needed to post Events; none posted")
        return None
    return EventPoster(settings.spool_dir, kube, client_factory)


def build_claims(
    kube: KubernetesSettings, client_factory: Callable[[], KubeApi], spool_dir: str = ""
) -> Optional[ClaimReader]:
    """The reader of the pod's ResourceClaims, when asked for (off by default) and the pod is known."""
    if not kube.resource_claims:
        return None
    if not kube.in_pod:
        logger.warning("oomsight sidecar: pod namespace and uid are needed to find the pod's ResourceClaims; none read")
        return None
    return ClaimReader(client_factory, kube.pod_namespace, kube.pod_uid, spool_dir)


def run(
    settings: SidecarSettings,
    stop: Optional[threading.Event] = None,
    kube: Optional[KubernetesSettings] = None,
    client_factory: Callable[[], KubeApi] = in_cluster_client,
    admin: Optional[AdminSettings] = None,
) -> int:
    stop = stop or threading.Event()
    kube = kube or KubernetesSettings()
    poster = build_poster(settings, kube, client_factory)
    collector = KubernetesCollector(poster, pod_owner(kube)) if kube.pod_name else None
    errors = ServerErrors()
    claims = build_claims(kube, client_factory, settings.spool_dir)
    app = build_app(settings, collector, errors, claims)
    try:
        server = serve(app, settings.host, settings.port, settings.limits, errors)
    except OSError as exc:  # a busy port: the command line names it (oomsight.tools.cli)
        exc.filename = f"{settings.port} on {settings.host}"
        raise
    admin_server = serve_admin(settings, admin, errors) if admin is not None else None
    logger.info("oomsight sidecar: serving %s on http://%s/metrics", settings.spool_dir, _hostport(server))
    if not app.check_ready():
        logger.warning(
            "oomsight sidecar: spool %s not readable yet; /readyz answers 503 until it is", settings.spool_dir
        )
    loop = _start_event_loop(poster, kube.events_interval_seconds, stop, app.trim)
    if claims is not None:
        start_refresh(claims, stop)
    while not stop.wait(0.5):
        pass  # a timed wait: a SIGTERM the kernel hands to another thread is seen here within 0.5 s
    if loop is not None and poster is not None:
        loop.join(timeout=10)
        poster.tick()  # post what the last moments of training left behind before the pod goes
    if settings.drain_seconds:
        logger.info("oomsight sidecar: draining for %.0f s so Prometheus gets a last scrape", settings.drain_seconds)
        threading.Event().wait(settings.drain_seconds)
    for srv in (server, admin_server):
        if srv is not None:
            stop_server(srv)
    return 0


def serve_admin(settings: SidecarSettings, admin: AdminSettings, errors: ServerErrors) -> Optional[WSGIServer]:
    """The admin endpoint, or None when it is off or its port is taken: the metrics go on
    without it (a second ``hostNetwork`` pod on a node must not crash over port 21401)."""
    if admin.port == 0:
        return None
    try:
        admin = ensure_token(admin)
        app = AdminApp(settings.spool_dir, admin.token)
        server = serve(app, admin.host, admin.port or 0, settings.limits, errors)
    except (OSError, ConfigError) as exc:
        logger.warning("oomsight sidecar: admin endpoint off: cannot listen on %s:%s (%s)", admin.host, admin.port, exc)
        return None
    where = f" (token in {admin.token_file})" if admin.require_token and admin.token_file else ""
    logger.info("oomsight sidecar: admin endpoint on http://%s/admin/%s", _hostport(server), where)
    return server


def _hostport(server: WSGIServer) -> str:
    host, port = str(server.server_address[0]), int(server.server_address[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _start_event_loop(
    poster: Optional[EventPoster], interval_seconds: float, stop: threading.Event, trim: Callable[[], None]
) -> Optional[threading.Thread]:
    if poster is None:
        return None

    def loop() -> None:
        while not stop.wait(interval_seconds):
            poster.tick()
            trim()  # what the tick parsed and let go (oomsight_sidecar.heap)

    thread = threading.Thread(target=loop, name="oomsight-events", daemon=True)
    thread.start()
    return thread


def tune_gc() -> None:
    """The sidecar's garbage collection thresholds (:data:`GC_THRESHOLD`), set once at start."""
    gc.set_threshold(*GC_THRESHOLD)


def spool_problem(path: str, named: str) -> Optional[str]:
    """Why ``path`` can never be a spool (a file, or a path through a file), else None. A spool that
    does not exist yet is no problem: ``/readyz`` answers 503 until the hook makes it."""
    try:
        mode = os.stat(path).st_mode
    except NotADirectoryError:
        return f"{named}{path} is inside a file, not a folder"
    except OSError:  # missing, or not readable yet: served, and /readyz says so
        return None
    return None if stat.S_ISDIR(mode) else f"{named}{path} is a file, not a folder"


def main(flags: dict[str, Any]) -> int:
    try:
        settings = SidecarSettings.from_env(**flags)
        kube = KubernetesSettings.from_env()
        admin = AdminSettings.from_env()
    except ConfigError as exc:
        logger.error("oomsight sidecar: invalid configuration: %s", exc)
        return 2
    env = BY_KEYWORD["spool_dir"].env  # the variable's name from the one table
    named = "--spool " if flags.get("spool_dir") else f"{env}=" if os.environ.get(env) else "spool "
    problem = spool_problem(settings.spool_dir, named)
    if problem:
        logger.error("oomsight sidecar: %s", problem)
        return 2  # oomsight.tools.exitcode.USAGE: a file where a folder is wanted (docs/cli.md)
    tune_gc()
    one_arena()  # before any thread: oomsight_sidecar.heap
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return run(settings, stop, kube, admin=admin)
