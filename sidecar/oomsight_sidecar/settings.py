"""Sidecar settings, one group per part (docs/configuration.md): the metrics server
(:class:`SidecarSettings`), the admin endpoint (:class:`AdminSettings`) and the pod it
runs in (:class:`KubernetesSettings`).

Their fields, variables and documentation come from the sidecar's settings table
(``oomsight.config.variables.SIDECAR``, generated into :mod:`oomsight.config.sidecar`); each
class here adds how its group is read (through the shared parsers of :mod:`oomsight.config`;
a variable set to blanks keeps its default) and checked. The CLI flags override the first.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from typing import Optional

from oomsight.config import ConfigError
from oomsight.config.sidecar import AdminFields, KubernetesFields, SidecarFields
from oomsight.config.table import read_group, variables, with_flags
from oomsight.config.variables import SIDECAR
from oomsight_server.listener import ServerLimits

_VARIABLE = variables(SIDECAR)
# The variables the admin endpoint names in its messages: their names as the table gives them.
ENV_ADMIN_HOST = _VARIABLE["admin_host"]
ENV_ADMIN_TOKEN = _VARIABLE["admin_token"]
ENV_ADMIN_TOKEN_FILE = _VARIABLE["admin_token_file"]
ENV_ADMIN_REQUIRE_TOKEN = _VARIABLE["admin_require_token"]


@dataclasses.dataclass(frozen=True)
class SidecarSettings(SidecarFields):
    """The metrics server and what it reads: the table's fields, and the servers' limits."""

    limits: ServerLimits = dataclasses.field(default_factory=ServerLimits)
    """Connection cap, timeouts and request-head cap of the metrics and admin servers."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> SidecarSettings:
        e = os.environ if env is None else env
        values: dict[str, object] = dict(read_group(SIDECAR, "sidecar", e))
        values["limits"] = ServerLimits.from_env(e, SIDECAR)
        return with_flags(cls, values, flags)

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is not a TCP port")
        for name in ("retention_seconds", "stale_after_seconds", "drain_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")


@dataclasses.dataclass(frozen=True)
class AdminSettings(AdminFields):
    """The admin endpoint (profiling requests, artifact downloads): ``OOMSIGHT_ADMIN_*``."""

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> AdminSettings:
        e = os.environ if env is None else env
        settings = cls(**read_group(SIDECAR, "admin", e))  # type: ignore[arg-type]
        if not settings.token and settings.token_file and os.path.exists(settings.token_file):
            try:
                with open(settings.token_file, encoding="utf-8") as fh:
                    settings = dataclasses.replace(settings, token=fh.read().strip() or None)
            except OSError as exc:
                raise ConfigError(f"{ENV_ADMIN_TOKEN_FILE}: cannot read the token file ({exc})") from None
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


def loopback(host: str) -> bool:
    """True for ``localhost`` and loopback literals (``127.0.0.1``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class KubernetesSettings(KubernetesFields):
    """The pod the sidecar runs in, as the webhook tells it (downward API and admission time)."""

    @property
    def in_pod(self) -> bool:
        """True when the downward-API identity is complete (Events need all three)."""
        return bool(self.pod_name and self.pod_namespace and self.pod_uid)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KubernetesSettings:
        e = os.environ if env is None else env
        return cls(**read_group(SIDECAR, "pod", e))  # type: ignore[arg-type]
