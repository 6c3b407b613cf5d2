"""The GPU memory budget a pod claimed through Dynamic Resource Allocation (opt-in).

With DRA (``resource.k8s.io/v1``, stable in Kubernetes 1.35) and its consumable capacity (beta,
on by default from 1.36), a pod may claim a share of a GPU's memory: the scheduler writes the
share it granted into the ResourceClaim's ``status.allocation.devices.results[].consumedCapacity``
(``{"memory": "16Gi"}``). Nothing enforces that share inside CUDA; the sidecar publishes it as
``oomsight_gpu_memory_budget_bytes`` so the rules can measure headroom and the forecast against it.

Which claims are the pod's: a pod names them in ``spec.resourceClaims`` (directly, or through a
template whose generated name is in ``status.resourceClaimStatuses``); the scheduler lists the pod
in each claim's ``status.reservedFor`` before the pod runs. The sidecar lists the ResourceClaims of
its namespace (the only grant it needs: ``list`` on ``resourceclaims`` there, the chart's
``rbac.resourceClaims``) and keeps those reserved for its own pod's uid.

A result names the device by driver, pool and device (``gpu.nvidia.com``, ``node-1``, ``gpu-0``),
not by the GPU's UUID, so the series carries ``dra_device="<pool>/<device>"`` instead of
``gpu_uuid``; the rules compare a pod's GPUs with the smallest budget of that pod
(docs/alerts.md, "GPU memory budgets").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from oomsight.wire import budget as budget_doc
from oomsight.wire.budget import Budget
from oomsight_server.kube import KubeApi

logger = logging.getLogger(__name__)

MEMORY = "memory"
"""The capacity name GPU DRA drivers give device memory (``consumedCapacity.memory``)."""
REFRESH_SECONDS = 60.0
"""How often the claims are listed again: an allocation does not change while the pod runs, but a
claim is reserved for the pod shortly before it starts, and a failed read is retried."""
RESULTS = ("read", "failed", "malformed")
"""What became of each listing, and each result the sidecar could not read (counted, never raised)."""


def parse_memory(value: Any) -> Optional[int]:
    """Bytes of a Kubernetes quantity (``16Gi``, ``17179869184``, ``16G``); None if it is not one."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        amount = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None
    return int(amount) if amount >= 0 else None


def reserved_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    """The claim's ``status.reservedFor`` lists the pod with this uid."""
    consumers = (claim.get("status") or {}).get("reservedFor") or []
    return any(isinstance(c, Mapping) and c.get("resource") == "pods" and c.get("uid") == pod_uid for c in consumers)


def claim_budgets(claim: Mapping[str, Any]) -> tuple[list[Budget], int]:
    """Each allocated device of ``claim`` with a memory share, and how many results were malformed.

    A result without ``consumedCapacity.memory`` (a whole GPU, or a driver without consumable
    capacity) gives no budget: the GPU's own capacity stays the limit."""
    name = str((claim.get("metadata") or {}).get("name", ""))
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    budgets, malformed = [], 0
    for result in results:
        capacity = result.get("consumedCapacity") if isinstance(result, Mapping) else None
        if not isinstance(capacity, Mapping) or MEMORY not in capacity:
            malformed += not isinstance(result, Mapping)
            continue
        memory = parse_memory(capacity[MEMORY])
        if memory is None:
            malformed += 1
            continue
        device = f"{result.get('pool', '')}/{result.get('device', '')}"
        budgets.append(Budget(name, str(result.get("request", "")), str(result.get("driver", "")), device, memory))
    return budgets, malformed


class ClaimReader:
    """The pod's budgets, read from the API every :data:`REFRESH_SECONDS` by :meth:`refresh`
    (a background thread) and kept for the scrapes: a slow API server never delays a scrape."""

    def __init__(
        self, client_factory: Callable[[], KubeApi], namespace: str, pod_uid: str, spool_dir: str = ""
    ) -> None:
        """``spool_dir``: where the budgets are also written for ``oomsight report`` (none when empty)."""
        self._factory = client_factory
        self.spool_dir = spool_dir
        self._client: Optional[KubeApi] = None
        self.namespace = namespace
        self.pod_uid = pod_uid
        self._lock = threading.Lock()
        self._budgets: list[Budget] = []
        self._counts = dict.fromkeys(RESULTS, 0)
        self._warned = False

    def budgets(self) -> list[Budget]:
        with self._lock:
            return list(self._budgets)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def refresh(self) -> None:
        """List the namespace's claims once; on failure keep the last budgets and count it."""
        try:
            self._client = self._client or self._factory()
            listing = self._client.list_resource_claims(self.namespace)
        except Exception as exc:  # one guard for the API, the client and the network: the sidecar serves on
            self._count("failed")
            if not self._warned:
                self._warned = True
                logger.warning(
                    "oomsight sidecar: cannot list ResourceClaims in %s (%s); no GPU memory budget until it can "
                    "(the chart's rbac.resourceClaims grants it)",
                    self.namespace,
                    exc,
                )
            return
        budgets, malformed = [], 0
        for claim in listing.get("items") or []:
            if isinstance(claim, Mapping) and reserved_for(claim, self.pod_uid):
                found, bad = claim_budgets(claim)
                budgets += found
                malformed += bad
        with self._lock:
            self._budgets = budgets
            self._counts["read"] += 1
            self._counts["malformed"] += malformed
        if self.spool_dir:
            try:
                budget_doc.write(self.spool_dir, budgets)
            except OSError as exc:  # a full or read-only spool: the metric still carries the budget
                logger.debug("oomsight sidecar: budget not written to the spool: %s", exc)

    def _count(self, result: str) -> None:
        with self._lock:
            self._counts[result] += 1


class ClaimCollector(Collector):
    """``oomsight_gpu_memory_budget_bytes`` (one series per claimed device share; none without a
    claim) and ``oomsight_resource_claim_reads_total``."""

    def __init__(self, reader: ClaimReader) -> None:
        self.reader = reader

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        budgets = self.reader.budgets()
        if budgets:
            family = GaugeMetricFamily(
                "oomsight_gpu_memory_budget_bytes",
                "GPU memory this pod claimed on a device through DRA (ResourceClaim consumedCapacity.memory).",
                labels=["claim", "request", "driver", "dra_device"],
            )
            for b in budgets:
                family.add_metric([b.claim, b.request, b.driver, b.dra_device], b.memory_bytes)
            yield family
        reads = CounterMetricFamily(
            "oomsight_resource_claim_reads",
            "Listings of the pod's ResourceClaims by result (read, failed) and device results not understood "
            "(malformed).",
            labels=["result"],
        )
        for key, value in self.reader.counts().items():
            reads.add_metric([key], value)
        yield reads


def start_refresh(
    reader: ClaimReader, stop: threading.Event, interval_seconds: float = REFRESH_SECONDS
) -> threading.Thread:
    """Read now, then every ``interval_seconds`` until ``stop``."""

    def loop() -> None:
        reader.refresh()
        while not stop.wait(interval_seconds):
            reader.refresh()

    thread = threading.Thread(target=loop, name="oomsight-claims", daemon=True)
    thread.start()
    return thread
