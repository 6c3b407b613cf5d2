"""Sidecar settings: one frozen dataclass, from ``OOMSIGHT_*`` variables and CLI flags."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Callable, TypeVar

from oomsight.analysis.inventory import DEFAULT_RETENTION_SECONDS, DEFAULT_STALE_AFTER_SECONDS
from oomsight.config import ENV_DIR, ConfigError, default_spool_dir

ENV_PORT = "OOMSIGHT_SIDECAR_PORT"
ENV_HOST = "OOMSIGHT_SIDECAR_HOST"
ENV_RETENTION = "OOMSIGHT_RETENTION_SECONDS"
ENV_STALE_AFTER = "OOMSIGHT_STALE_AFTER_SECONDS"
ENV_DRAIN = "OOMSIGHT_DRAIN_SECONDS"

DEFAULT_PORT = 21400

N = TypeVar("N", int, float)


@dataclasses.dataclass(frozen=True)
class SidecarSettings:
    spool_dir: str = dataclasses.field(default_factory=default_spool_dir)
    """The spool directory the training containers write (``OOMSIGHT_DIR``)."""

    host: str = "0.0.0.0"
    """Address of the metrics listener; the pod IP must reach it for Prometheus."""

    port: int = DEFAULT_PORT
    """Metrics port (named ``metrics`` in the pod), outside the 9100-9999 exporter range."""

    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    """How long an exited process's series stay before they vanish."""

    stale_after_seconds: float = DEFAULT_STALE_AFTER_SECONDS
    """A process silent for longer than this is treated as gone (killed)."""

    drain_seconds: float = 0.0
    """After SIGTERM keep serving this long, so Prometheus gets a last scrape."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> SidecarSettings:
        e = os.environ if env is None else env
        d = cls()
        values: dict[str, object] = {
            "spool_dir": e.get(ENV_DIR) or d.spool_dir,
            "host": e.get(ENV_HOST) or d.host,
            "port": number_env(e, ENV_PORT, d.port, int),
            "retention_seconds": number_env(e, ENV_RETENTION, d.retention_seconds, float),
            "stale_after_seconds": number_env(e, ENV_STALE_AFTER, d.stale_after_seconds, float),
            "drain_seconds": number_env(e, ENV_DRAIN, d.drain_seconds, float),
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


def number_env(env: Mapping[str, str], name: str, default: N, kind: Callable[[str], N]) -> N:
    """``kind(env[name])``, ``default`` when unset or empty; :class:`ConfigError` naming ``name`` otherwise."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a valid {getattr(kind, '__name__', 'number')}") from None


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
        events_raw = e.get(ENV_EVENTS, "1").strip().lower()
        if events_raw not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"{ENV_EVENTS}={events_raw!r} is not a boolean; use 1 or 0")
        settings = cls(
            pod_name=e.get(ENV_POD_NAME, ""),
            pod_namespace=e.get(ENV_POD_NAMESPACE, ""),
            pod_uid=e.get(ENV_POD_UID, ""),
            owner_kind=e.get(ENV_OWNER_KIND, ""),
            owner_name=e.get(ENV_OWNER_NAME, ""),
            events=events_raw in ("1", "true", "yes", "on"),
            events_interval_seconds=number_env(e, ENV_EVENTS_INTERVAL, d.events_interval_seconds, float),
            events_max=number_env(e, ENV_EVENTS_MAX, d.events_max, int),
        )
        if settings.events_interval_seconds <= 0 or settings.events_max < 0:
            raise ConfigError(f"{ENV_EVENTS_INTERVAL} must be positive and {ENV_EVENTS_MAX} not negative")
        return settings
