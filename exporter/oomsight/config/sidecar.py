"""The fields of the sidecar's settings groups: one frozen dataclass each, a docstring per field.

GENERATED from the tables of ``oomsight.config.variables`` by ``python -m
oomsight.config.rendering``: edit the table, not this file. Each field's docstring names its
variable (and flag). ``oomsight_sidecar.settings`` extends each class with how it is read and
checked.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from oomsight.config.variables import default_spool_dir


@dataclasses.dataclass(frozen=True)
class SidecarFields:
    """The metrics server and what it reads."""

    spool_dir: str = dataclasses.field(default_factory=default_spool_dir)
    """Spool directory to serve (``OOMSIGHT_DIR``; ``--spool``)."""

    port: int = 21_400
    """Metrics port, outside the crowded 9100-9999 exporter range (9400 is dcgm-exporter's)
    (``OOMSIGHT_SIDECAR_PORT``; ``--port``)."""

    host: str = "127.0.0.1"
    """Listen address: this machine only when run by hand; the webhook gives the injected sidecar ``0.0.0.0``, so
    Prometheus reaches the pod IP (``::`` for IPv6) (``OOMSIGHT_SIDECAR_HOST``; ``--host``)."""

    retention_seconds: float = 300.0
    """An exited process's series stay this long (``OOMSIGHT_RETENTION_SECONDS``; ``--retention-seconds``)."""

    stale_after_seconds: float = 30.0
    """A process silent for this long counts as gone (``OOMSIGHT_STALE_AFTER_SECONDS``; ``--stale-after-seconds``)."""

    drain_seconds: float = 0.0
    """After SIGTERM, keep serving this long for a last scrape (``OOMSIGHT_DRAIN_SECONDS``; ``--drain-seconds``)."""

    hung_after_seconds: float = 20.0
    """A collect running longer than this makes ``/readyz`` 503 and ``/healthz`` 500 (the kubelet restarts a sidecar
    stuck on a hung filesystem); ``/readyz`` is also 503 while the last collect raised
    (``OOMSIGHT_SIDECAR_HUNG_AFTER_SECONDS``)."""


@dataclasses.dataclass(frozen=True)
class AdminFields:
    """The admin endpoint (profiling requests, artifact downloads)."""

    host: str = "127.0.0.1"
    """Admin endpoint address (``POST /admin/profile?steps=N`` and ``&memory_only=1``, ``GET /admin/profiles``, ``GET
    /admin/artifacts/<name>``); reach it with ``kubectl port-forward``. Any non-loopback address requires a token
    (``OOMSIGHT_ADMIN_HOST``)."""

    port: Optional[int] = 21_401
    """Admin port; ``0`` turns the endpoint off; ``auto`` lets the system pick a free port (logged at start). A port
    already taken turns the endpoint off with a warning; the metrics go on (``OOMSIGHT_ADMIN_PORT``)."""

    token: Optional[str] = None
    """Bearer token every admin request must carry (``Authorization: Bearer …``) (``OOMSIGHT_ADMIN_TOKEN``)."""

    token_file: str = ""
    """The file the token is read from when ``OOMSIGHT_ADMIN_TOKEN`` is unset; with ``OOMSIGHT_ADMIN_REQUIRE_TOKEN``
    and no file there, one is made (mode 0600) (``OOMSIGHT_ADMIN_TOKEN_FILE``)."""

    require_token: bool = False
    """Require a token even on loopback; with no token, one is made and written to ``OOMSIGHT_ADMIN_TOKEN_FILE``
    (mode 0600). The webhook sets it, with ``OOMSIGHT_ADMIN_PORT=auto``, in ``hostNetwork`` pods, whose loopback
    is the node's (``OOMSIGHT_ADMIN_REQUIRE_TOKEN``)."""


@dataclasses.dataclass(frozen=True)
class KubernetesFields:
    """The pod the sidecar runs in, as the webhook tells it (downward API, admission)."""

    pod_name: str = ""
    """The pod's name (downward API); empty outside Kubernetes (``OOMSIGHT_POD_NAME``)."""

    pod_namespace: str = ""
    """The pod's namespace (downward API) (``OOMSIGHT_POD_NAMESPACE``)."""

    pod_uid: str = ""
    """The pod's uid (downward API): Events name the pod by it; name, namespace and uid are all needed to post Events
    (``OOMSIGHT_POD_UID``)."""

    owner_kind: str = ""
    """The kind of the pod's controller (``Job``, ``PyTorchJob``, ...), read by the webhook from ``ownerReferences``
    (``OOMSIGHT_OWNER_KIND``)."""

    owner_name: str = ""
    """The name of the pod's controller; with its kind, published as ``oomsight_pod_owner_info``
    (``OOMSIGHT_OWNER_NAME``)."""

    events: bool = True
    """Post an ``events.k8s.io/v1`` Event for each new OOM (needs the chart's RBAC grant; annotation
    ``oomsight.io/events: "false"`` turns it off per pod) (``OOMSIGHT_EVENTS``)."""

    events_interval_seconds: float = 2.0
    """How often the spool is checked for new OOM events (and once more at SIGTERM)
    (``OOMSIGHT_EVENTS_INTERVAL_SECONDS``)."""

    events_max: int = 100
    """Events per pod at most; later OOMs are counted as ``suppressed``, not posted (``OOMSIGHT_EVENTS_MAX``)."""

    resource_claims: bool = False
    """Read the GPU memory budget of the pod's DRA ResourceClaims (``oomsight_gpu_memory_budget_bytes``; needs the
    chart's ``rbac.resourceClaims`` grant to list ResourceClaims in the pod's namespace)
    (``OOMSIGHT_RESOURCE_CLAIMS``)."""
