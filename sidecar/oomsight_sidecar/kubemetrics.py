"""The sidecar's own Kubernetes metrics: Events posted, swallowed errors, the pod's owner.

A second collector next to the spool collector (``docs/metrics.md``, "Kubernetes"),
so ``oomsight run`` outside a cluster does not publish them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from oomsight_server.counter import labelled_counter
from oomsight_server.owner import Owner
from oomsight_sidecar.events import ERROR_COMPONENTS, RESULTS, EventPoster


class KubernetesCollector(Collector):
    def __init__(self, poster: Optional[EventPoster], owner: Optional[Owner]) -> None:
        self.poster = poster
        self.owner = owner

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        results, errors = self.poster.counts() if self.poster else ({}, {})
        yield labelled_counter(
            "oomsight_kubernetes_events",
            "OOM events by what became of their Kubernetes Event: posted, failed (no RBAC grant, API error) "
            "or suppressed (over OOMSIGHT_EVENTS_MAX).",
            "result",
            {key: results.get(key, 0) for key in RESULTS},
        )
        yield labelled_counter(
            "oomsight_sidecar_errors",
            "Errors the sidecar caught and carried on from, by component.",
            "component",
            {key: errors.get(key, 0) for key in ERROR_COMPONENTS},
        )
        if self.owner is not None:
            info = InfoMetricFamily(
                "oomsight_pod_owner", "The workload this pod belongs to (its controller owner reference)."
            )
            info.add_metric([], {"owner_kind": self.owner.kind, "owner_name": self.owner.name})
            yield info
