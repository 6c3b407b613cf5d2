"""Sidecar settings: one frozen dataclass, from ``OOMSIGHT_*`` variables and CLI flags."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from oomsight.config import ENV_DIR, ConfigError, default_spool_dir
from oomsight.inventory import DEFAULT_RETENTION_SECONDS, DEFAULT_STALE_AFTER_SECONDS

ENV_PORT = "OOMSIGHT_SIDECAR_PORT"
ENV_HOST = "OOMSIGHT_SIDECAR_HOST"
ENV_RETENTION = "OOMSIGHT_RETENTION_SECONDS"
ENV_STALE_AFTER = "OOMSIGHT_STALE_AFTER_SECONDS"
ENV_DRAIN = "OOMSIGHT_DRAIN_SECONDS"

DEFAULT_PORT = 21400


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
            "port": _number(e, ENV_PORT, d.port, int),
            "retention_seconds": _number(e, ENV_RETENTION, d.retention_seconds, float),
            "stale_after_seconds": _number(e, ENV_STALE_AFTER, d.stale_after_seconds, float),
            "drain_seconds": _number(e, ENV_DRAIN, d.drain_seconds, float),
        }
        values.update({k: v for k, v in flags.items() if v is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not a TCP port")
        for name in ("retention_seconds", "stale_after_seconds", "drain_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")


def _number(env: Mapping[str, str], name: str, default: float, kind: type) -> object:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
