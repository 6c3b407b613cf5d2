"""Webhook settings: one frozen dataclass, from ``OOMSIGHT_WEBHOOK_*`` variables and CLI flags.

Its fields, variables and documentation come from the webhook's settings table
(``oomsight.config.variables.WEBHOOK``, generated into :mod:`oomsight.config.webhook`); the class
here adds the servers' limits, how the group is read (through the shared parsers; a variable set
to blanks keeps its default) and checked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from oomsight.config import ConfigError
from oomsight.config.table import read_group, with_flags
from oomsight.config.variables import WEBHOOK
from oomsight.config.webhook import WebhookFields
from oomsight_server.listener import ServerLimits

_VARIABLE = {row.field: row.variable for row in WEBHOOK}
TLS_MODES = ("self", "files")


@dataclasses.dataclass(frozen=True)
class WebhookSettings(WebhookFields):
    """The admission webhook's server and TLS; the chart sets them (``templates/deployment.yaml``)."""

    limits: ServerLimits = dataclasses.field(default_factory=lambda: ServerLimits.from_env({}, WEBHOOK))
    """Connections held, workers, idle timeout, the read deadline of a request (handshake, head,
    body) and head size (docs/kubernetes.md, "Server limits")."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **flags: object) -> WebhookSettings:
        e = os.environ if env is None else env
        values: dict[str, object] = dict(read_group(WEBHOOK, "webhook", e))
        values["limits"] = ServerLimits.from_env(e, WEBHOOK)
        return with_flags(cls, values, flags)

    def validate(self) -> None:
        v = _VARIABLE
        if self.tls_mode not in TLS_MODES:
            raise ConfigError(f"{v['tls_mode']}={self.tls_mode!r} must be one of {', '.join(TLS_MODES)}")
        needed = ("namespace", "service", "secret", "configuration")
        missing = [v[name] for name in needed if not getattr(self, name)]
        if self.tls_mode == "self" and missing:
            raise ConfigError(f"TLS mode 'self' needs {', '.join(missing)}")
        if not self.host or any(c.isspace() or c in "/[]" for c in self.host):
            raise ConfigError(f"{v['host']}={self.host!r} is not a listen address (an IP or host name)")
        for name, port in (("port", self.port), ("metrics_port", self.metrics_port)):
            if not 0 <= port <= 65535:
                raise ConfigError(f"webhook {name} {port} is not a TCP port")
        if self.tls_reconcile_seconds <= 0 or self.max_body_bytes <= 0:
            raise ConfigError(f"{v['tls_reconcile_seconds']} and {v['max_body_bytes']} must be positive")
        if self.max_review_bytes > self.max_body_bytes:
            raise ConfigError(f"{v['max_review_bytes']} must not be above {v['max_body_bytes']}")
