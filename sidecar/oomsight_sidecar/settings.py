"""Sidecar settings, one group per part (docs/configuration.md): the metrics server
(:class:`SidecarSettings`), the admin endpoint (:class:`AdminSettings`) and the pod it
runs in (:class:`KubernetesSettings`). Each reads only its own ``OOMSIGHT_*`` variables
through the shared parsers of :mod:`oomsight.config`; the CLI flags override the first.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
from collections.abc import Mapping
from typing import Optional, TypeVar

from oomsight.analysis.inventory import DEFAULT_RETENTION_SECONDS, DEFAULT_STALE_AFTER_SECONDS
from oomsight.config import (
    DEFAULT_METRICS_PORT,
    ENV_DIR,
    ConfigError,
    default_spool_dir,
    env_setting,
    parse_bool,
    parse_count,
    parse_port,
    parse_seconds,
)
from oomsight_sidecar.listener import ServerLimits

ENV_PORT = "OOMSIGHT_SIDECAR_PORT"
ENV_HOST = "OOMSIGHT_SIDECAR_HOST"
ENV_RETENTION = "OOMSIGHT_RETENTION_SECONDS"
ENV_STALE_AFTER = "OOMSIGHT_STALE_AFTER_SECONDS"
ENV_DRAIN = "OOMSIGHT_DRAIN_SECONDS"
ENV_HUNG_AFTER = "OOMSIGHT_SIDECAR_HUNG_AFTER_SECONDS"
LIMITS_PREFIX = "OOMSIGHT_SIDECAR"

DEFAULT_PORT = DEFAULT_METRICS_PORT
_YEAR = 365 * 86_400.0
_long_seconds = functools.partial(parse_seconds, minimum=0.0, maximum=_YEAR)


@dataclasses.dataclass(frozen=True)
class SidecarSettings:
    """The metrics server and what it reads."""

    spool_dir: str = dataclasses.field(default_factory=default_spool_dir)
    """The spool directory the training containers write (``OOMSIGHT_DIR``)."""

    host: str = "127.0.0.1"
    """Address of the metrics listener: this machine only by default (``oomsight sidecar`` on a
    laptop); in a pod the injection sets ``0.0.0.0`` so Prometheus reaches the pod IP (``::`` for IPv6)."""

    port: int = DEFAULT_PORT
    """Metrics port (named ``metrics`` in the pod), outside the 9100-9999 exporter range."""

    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    """How long an exited process's series stay before they vanish."""

    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    """A process silent for longer than this is treated as gone (killed)."""

    drain_seconds: float = 0.0
    """After SIGTERM keep serving this long, so Prometheus gets a last scrape."""

    hung_after_seconds: float = 20.0
    """A collect running longer than this makes ``/readyz`` 503 and ``/healthz`` 500."""

    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    """Connection cap, timeouts and request-head cap of the metrics and admin servers."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> SidecarSettings:
        e = os.environ if env is None else env
        d = cls()
        values: dict[str, object] = {
            "spool_dir": e.get(ENV_DIR) or d.spool_dir,
            "host": e.get(ENV_HOST) or d.host,
            "port": env_setting(e, ENV_PORT, parse_port, d.port),
            "retention_seconds": env_setting(e, ENV_RETENTION, _long_seconds, d.retention_seconds),
            "stale_after_seconds": env_setting(e, ENV_STALE_AFTER, _long_seconds, d.stale_after_seconds),
            "drain_seconds": env_setting(e, ENV_DRAIN, _long_seconds, d.drain_seconds),
            "hung_after_seconds": env_setting(e, ENV_HUNG_AFTER, parse_seconds, d.hung_after_seconds),
            "limits": ServerLimits.from_env(e, LIMITS_PREFIX),
        }
        return with_flags(cls, values, flags)

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not a TCP port")
        for name in ("retention_seconds", "stale_after_seconds", "drain_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")


S = TypeVar("S")


def with_flags(cls: type[S], values: dict[str, object], flags: Mapping[str, object]) -> S:
    """Settings from env ``values`` overridden by the CLI ``flags`` that were given, validated."""
    values.update({k: v for k, v in flags.items() if v is not None})
    settings = cls(**values)
    settings.validate()  # type: ignore[attr-defined]
    return settings


ENV_ADMIN_HOST = "OOMSIGHT_ADMIN_HOST"
ENV_ADMIN_PORT = "OOMSIGHT_ADMIN_PORT"
ENV_ADMIN_TOKEN = "OOMSIGHT_ADMIN_TOKEN"
ENV_ADMIN_TOKEN_FILE = "OOMSIGHT_ADMIN_TOKEN_FILE"
ENV_ADMIN_REQUIRE_TOKEN = "OOMSIGHT_ADMIN_REQUIRE_TOKEN"
DEFAULT_ADMIN_PORT = 21401
ADMIN_PORT_AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class AdminSettings:
    """The admin endpoint (profiling requests, artifact downloads): ``OOMSIGHT_ADMIN_*``."""

    host: str = "127.0.0.1"
    """Listen address; anything but loopback needs a token."""

    port: Optional[int] = DEFAULT_ADMIN_PORT
    """Admin port; 0 turns the endpoint off; None (``auto``) lets the system pick a free one."""

    token: Optional[str] = None
    """Bearer token every request must carry (required when not on loopback)."""

    token_file: str = ""
    """Where the token is read from; with ``require_token`` and no file there, one is made."""

    require_token: bool = False
    """Refuse to serve without a token even on loopback: the webhook sets it for
    ``hostNetwork`` pods, whose loopback is the node's."""

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> AdminSettings:
        e = os.environ if env is None else env
        token_file = (e.get(ENV_ADMIN_TOKEN_FILE) or "").strip()
        token = e.get(ENV_ADMIN_TOKEN) or None
        if not token and token_file and os.path.exists(token_file):
            try:
                with open(token_file, encoding="utf-8") as fh:
                    token = fh.read().strip() or None
            except OSError as exc:
                raise ConfigError(f"{ENV_ADMIN_TOKEN_FILE}: cannot read the token file ({exc})") from None
        settings = cls(
            host=(e.get(ENV_ADMIN_HOST) or "127.0.0.1").strip(),
            port=env_setting(e, ENV_ADMIN_PORT, parse_admin_port, cls().port),
            token=token,
            token_file=token_file,
            require_token=env_setting(e, ENV_ADMIN_REQUIRE_TOKEN, parse_bool, False),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.port == 0 or self.token:
            return
        if not loopback(self.host):
            raise ConfigError(
                f"the admin endpoint would listen on {self.host} without a token: set {ENV_ADMIN_TOKEN} "
                f"(or {ENV_ADMIN_TOKEN_FILE}), or keep {ENV_ADMIN_HOST}=127.0.0.1 and use kubectl port-forward"
            )
        if self.require_token and not self.token_file:
            raise ConfigError(f"{ENV_ADMIN_REQUIRE_TOKEN}=1 needs {ENV_ADMIN_TOKEN} or {ENV_ADMIN_TOKEN_FILE}")


def parse_admin_port(name: str, raw: str) -> Optional[int]:
    """A port for the admin endpoint: 0 (off), 1-65535, or ``auto`` (None: the system picks)."""
    return None if raw.strip().lower() == ADMIN_PORT_AUTO else parse_port(name, raw)


def loopback(host: str) -> bool:
    """True for ``localhost`` and loopback literals (``127.0.0.1``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ENV_POD_NAME = "OOMSIGHT_POD_NAME"
ENV_POD_NAMESPACE = "OOMSIGHT_POD_NAMESPACE"
ENV_POD_UID = "OOMSIGHT_POD_UID"
ENV_OWNER_KIND = "OOMSIGHT_OWNER_KIND"
ENV_OWNER_NAME = "OOMSIGHT_OWNER_NAME"
ENV_EVENTS = "OOMSIGHT_EVENTS"
ENV_EVENTS_INTERVAL = "OOMSIGHT_EVENTS_INTERVAL_SECONDS"
ENV_EVENTS_MAX = "OOMSIGHT_EVENTS_MAX"


@dataclasses.dataclass(frozen=True)
class KubernetesSettings:
    """The pod the sidecar runs in, as the webhook tells it (downward API and admission time)."""

    pod_name: str = ""
    """``metadata.name`` of the pod (downward API); empty outside Kubernetes."""

    pod_namespace: str = ""
    """``metadata.namespace`` of the pod (downward API)."""

    pod_uid: str = ""
    """``metadata.uid`` of the pod (downward API): Events name the pod by it."""

    owner_kind: str = ""
    """Kind of the pod's controller (``Job``, ``PyTorchJob``, ...), read by the webhook at admission."""

    owner_name: str = ""
    """Name of the pod's controller; with ``owner_kind`` it labels ``oomsight_pod_owner_info``."""

    events: bool = True
    """Post an ``events.k8s.io/v1`` Event on the pod for every new OOM (needs the chart's RBAC grant)."""

    events_interval_seconds: float = 2.0
    """How often the spool is checked for new OOM events to post."""

    events_max: int = 100
    """At most this many Events per pod; later OOMs are counted as ``suppressed``, not posted."""

    @property
    def in_pod(self) -> bool:
        """True when the downward-API identity is complete (Events need all three)."""
        return bool(self.pod_name and self.pod_namespace and self.pod_uid)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubernetesSettings:
        e = os.environ if env is None else env
        d = cls()
        settings = cls(
            pod_name=e.get(ENV_POD_NAME, ""),
            pod_namespace=e.get(ENV_POD_NAMESPACE, ""),
            pod_uid=e.get(ENV_POD_UID, ""),
            owner_kind=e.get(ENV_OWNER_KIND, ""),
            owner_name=e.get(ENV_OWNER_NAME, ""),
            events=env_setting(e, ENV_EVENTS, parse_bool, d.events),
            events_interval_seconds=env_setting(e, ENV_EVENTS_INTERVAL, parse_seconds, d.events_interval_seconds),
            events_max=env_setting(e, ENV_EVENTS_MAX, functools.partial(parse_count, minimum=0), d.events_max),
        )
        if settings.events_interval_seconds <= 0 or settings.events_max < 0:
            raise ConfigError(f"{ENV_EVENTS_INTERVAL} must be positive and {ENV_EVENTS_MAX} not negative")
        return settings
