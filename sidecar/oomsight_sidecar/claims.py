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

Bounded and robust (issue 36): the claims are listed in pages of :data:`PAGE_CLAIMS` (``limit`` and
``continue``) where the client offers pages (``oomsight_server.kube.KubeClient`` does), at most
:data:`MAX_PAGES` pages of at most :data:`PAGE_MAX_BYTES` each (a longer page is asked for again with
fewer claims); the client keeps only the keys read here while it parses a page, and of the claims only
the budgets of the pod's own are kept, so 50,000 claims of other pods in the namespace cost one page
at a time. The
API has no field selector for ``status.reservedFor``, so the pod's claims are picked out here. Items
that are not claims (``items`` not a list, a claim or its status not a map) are skipped and counted
``malformed``; a listing cut at the bound is counted ``truncated``; nothing in an answer ends the
refresh thread (a defect of ours is counted ``failed``).

A result names the device by driver, pool and device (``gpu.nvidia.com``, ``node-1``, ``gpu-0``),
not by the GPU's UUID, so the series carries ``dra_device="<pool>/<device>"`` instead of
``gpu_uuid``; the rules compare a pod's GPUs with the smallest budget of that pod
(docs/alerts.md, "GPU memory budgets").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from oomsight.wire import budget as budget_doc
from oomsight.wire.budget import Budget
from oomsight_server.kube import KubeApi, PageTooLarge

logger = logging.getLogger(__name__)

MEMORY = "memory"
"""The capacity name GPU DRA drivers give device memory (``consumedCapacity.memory``)."""
REFRESH_SECONDS = 60.0
"""How often the claims are listed again: an allocation does not change while the pod runs, but a
claim is reserved for the pod shortly before it starts, and a failed read is retried."""
RESULTS = ("read", "failed", "malformed", "truncated")
"""What became of each listing, each item or result the sidecar could not read, and each listing cut at
:data:`MAX_PAGES` (counted, never raised)."""
PAGE_CLAIMS = 100
"""Claims asked for per page (``limit``): a claim is 2 to 100 KB of JSON (annotations included)."""
PAGE_MAX_BYTES = 2 * 1024 * 1024
"""The most bytes of one page the client reads. A longer page is asked for again from the same place
with a quarter of the claims (down to one: etcd stores no object over 1.5 MiB by default); one claim
longer than this fails the listing (``failed``)."""
MAX_PAGES = 1000
"""Pages asked for per listing (100,000 claims at :data:`PAGE_CLAIMS` a page; pages asked for again
count); past it the listing is ``truncated`` and what was read is used."""


def parse_memory(value: Any) -> Optional[int]:
    """Bytes of a Kubernetes quantity (``16Gi``, ``17179869184``, ``16G``); None if it is not one."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        amount = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError):
        return None
    return int(amount) if amount >= 0 else None


class ClaimPages(Protocol):
    """A client that lists ResourceClaims a page at a time, raising ``PageTooLarge`` past ``max_bytes``
    (``oomsight_server.kube.KubeClient``; the plain ``list_resource_claims`` is used otherwise)."""

    def list_resource_claims_page(self, namespace: str, limit: int, continue_token: str, max_bytes: int) -> Any: ...


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def reserved_for(claim: Mapping[str, Any], pod_uid: str) -> bool:
    """The claim's ``status.reservedFor`` lists the pod with this uid."""
    consumers = _list(_map(claim.get("status")).get("reservedFor"))
    return any(isinstance(c, Mapping) and c.get("resource") == "pods" and c.get("uid") == pod_uid for c in consumers)


def claim_budgets(claim: Mapping[str, Any]) -> tuple[list[Budget], int]:
    """Each allocated device of ``claim`` with a memory share, and how many results were malformed.

    A result without ``consumedCapacity.memory`` (a whole GPU, or a driver without consumable
    capacity) gives no budget: the GPU's own capacity stays the limit."""
    name = str(_map(claim.get("metadata")).get("name", ""))[:253]
    allocation = _map(_map(claim.get("status")).get("allocation"))
    results = _map(allocation.get("devices")).get("results") or []
    if not isinstance(results, list):
        return [], 1
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
        device = f"{str(result.get('pool', ''))[:253]}/{str(result.get('device', ''))[:253]}"
        request, driver = str(result.get("request", ""))[:253], str(result.get("driver", ""))[:253]
        budgets.append(Budget(name, request, driver, device, memory))
    return budgets, malformed


def pod_budgets(items: Any, pod_uid: str) -> tuple[list[Budget], int]:
    """The budgets of the claims of ``items`` reserved for the pod, and how many items or results were
    malformed (``items`` not a list counts one)."""
    if not isinstance(items, list):
        return [], 1
    budgets, malformed = [], 0
    for claim in items:
        if not isinstance(claim, Mapping) or not isinstance(claim.get("status") or {}, Mapping):
            malformed += 1
            continue
        if reserved_for(claim, pod_uid):
            found, bad = claim_budgets(claim)
            budgets += found
            malformed += bad
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
        """List the namespace's claims once; on failure keep the last budgets and count it. Never raises."""
        try:
            self._client = self._client or self._factory()
            found = self._list(self._client)
        except Exception as exc:  # one guard for the API, the client, the network and our defects: serve on
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
        if found is None:  # not a listing at all: counted, the last budgets kept
            return
        with self._lock:
            self._budgets = found
            self._counts["read"] += 1
        if self.spool_dir:
            try:
                budget_doc.write(self.spool_dir, found)
            except OSError as exc:  # a full or read-only spool: the metric still carries the budget
                logger.debug("oomsight sidecar: budget not written to the spool: %s", exc)

    def _list(self, client: Any) -> Optional[list[Budget]]:
        """The pod's budgets, page by page where the client can; None where an answer is not a listing."""
        pages = getattr(client, "list_resource_claims_page", None)
        if pages is None:
            read = self._read(client.list_resource_claims(self.namespace))
            return None if read is None else read[0]
        budgets: list[Budget] = []
        token, limit = "", PAGE_CLAIMS
        for _ in range(MAX_PAGES):
            try:
                page = pages(self.namespace, limit, token, PAGE_MAX_BYTES)
            except PageTooLarge:
                if limit == 1:
                    raise  # one claim longer than the bound: the listing failed (counted)
                limit = max(1, limit // 4)  # claims with long annotations: fewer a page, from the same place
                continue
            read = self._read(page)
            if read is None:
                return None
            found, token = read
            budgets += found
            if not token:
                return budgets
        self._count("truncated")
        return budgets

    def _read(self, page: Any) -> Optional[tuple[list[Budget], str]]:
        """The pod's budgets in one page and the next page's token (empty at the end); None (counted
        malformed) where the page is not a listing."""
        if not isinstance(page, Mapping) or "items" not in page:
            self._count("malformed")
            return None
        found, malformed = pod_budgets(page["items"], self.pod_uid)
        if malformed:
            self._count("malformed", malformed)
        token = _map(page.get("metadata")).get("continue")
        return found, token if isinstance(token, str) else ""

    def _count(self, result: str, n: int = 1) -> None:
        with self._lock:
            self._counts[result] += n


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
            "Listings of the pod's ResourceClaims by result (read, failed, truncated at the page bound) and "
            "claims or device results not understood (malformed).",
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
        reader.refresh()  # never raises: the thread lives until ``stop``
        while not stop.wait(interval_seconds):
            reader.refresh()

    thread = threading.Thread(target=loop, name="oomsight-claims", daemon=True)
    thread.start()
    return thread
