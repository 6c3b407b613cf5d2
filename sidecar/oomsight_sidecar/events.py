"""Kubernetes Events for CUDA OOMs: ``kubectl describe pod`` says what happened and why.

Each OOM event file in the spool becomes at most one ``events.k8s.io/v1`` Event on the
pod. Posted-once is kept two ways:

- the ids of handled OOM events are remembered in ``<spool>/sidecar/events-posted.json``
  (the spool is an ``emptyDir``: it outlives a sidecar restart, not the pod);
- the Event's name is derived from the OOM event's id, so if that file is lost the
  API server answers 409 AlreadyExists and nothing is posted twice.

Failures never stop the sidecar: a missing RBAC grant is logged once, each failed
call is counted (``oomsight_sidecar_errors_total{component="events_api"}``) and the
OOM is counted as ``failed`` in ``oomsight_kubernetes_events_total``; errors that may
pass (no answer, 429, 5xx) are retried on the next ticks, up to three attempts.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import threading
from collections import Counter
from typing import Callable, Optional

from oomsight.analysis.units import format_bytes as fb
from oomsight.wire import decoding
from oomsight.wire.layout import EVENTS
from oomsight.wire.schema import OomEvent
from oomsight.wire.spool import SpoolReader, write_atomic
from oomsight_server.kube import Json, KubeApi, KubeError
from oomsight_sidecar.settings import KubernetesSettings

logger = logging.getLogger(__name__)

REASON = "CUDAOutOfMemory"
ACTION = "Allocate"
REPORTING_CONTROLLER = "oomsight.io/sidecar"
NOTE_MAX_BYTES = 1024
"""The API server rejects an Event whose ``note`` is longer than 1 kB."""
FIELD_MAX_CHARS = 128
"""``reportingInstance``, ``reason`` and ``action`` are at most 128 characters."""
MAX_ATTEMPTS = 3
STATE_DIR = "sidecar"
STATE_FILE = "events-posted.json"
RESULTS = ("posted", "failed", "suppressed")
ERROR_COMPONENTS = ("events_api", "events_state", "events_document", "kubernetes_client")
STATE_MAX_BYTES = 4 * 1024 * 1024


def oom_id(ev: OomEvent) -> str:
    """``<process id>.oom-<seq>``: the OOM event file's name without ``.json``."""
    return f"{ev['process']['id']}.oom-{ev['seq']:05d}"


def event_name(pod_name: str, oom: str) -> str:
    """A stable, valid object name: the same OOM always gives the same Event name."""
    return f"{pod_name[:200]}.oomsight.{hashlib.sha256(oom.encode()).hexdigest()[:16]}"


def micro_time(unix_seconds: float) -> str:
    """RFC 3339 with microseconds, the ``MicroTime`` format of ``eventTime``."""
    moment = datetime.datetime.fromtimestamp(unix_seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def note(ev: OomEvent) -> str:
    """One paragraph: what failed, the allocator's state, the diagnosis and its first remedy."""
    p, diag = ev["process"], ev["diagnosis"]
    text = (
        f"CUDA out of memory in rank {p['rank']} on GPU {ev['device']} ({ev['gpu_uuid']}): "
        f"a {fb(ev['requested_bytes'])} allocation failed with {fb(ev['device_free_bytes'])} free "
        f"of {fb(ev['device_total_bytes'])}; PyTorch held {fb(ev['allocated_bytes'])} in tensors and "
        f"{fb(ev['reserved_bytes'])} reserved. Cause ({diag['cause']}): {diag['summary']}"
    )
    if diag["remedies"]:
        text += f" Try: {diag['remedies'][0]}"
    return truncate_utf8(text, NOTE_MAX_BYTES)


def truncate_utf8(text: str, max_bytes: int) -> str:
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    return raw[: max_bytes - 3].decode(errors="ignore") + "..."


def event_body(ev: OomEvent, pod: KubernetesSettings) -> Json:
    """The ``events.k8s.io/v1`` Event about ``pod`` for one OOM."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(pod.pod_name, oom_id(ev)),
            "namespace": pod.pod_namespace,
            "labels": {"app.kubernetes.io/managed-by": "oomsight"},
        },
        "eventTime": micro_time(ev["time"]),
        "type": "Warning",
        "reason": REASON,
        "action": ACTION,
        "note": note(ev),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": pod.pod_name[:FIELD_MAX_CHARS],
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.pod_name,
            "namespace": pod.pod_namespace,
            "uid": pod.pod_uid,
        },
    }


class PostedState:
    """The ids of OOM events already handled, in a small JSON file in the spool."""

    def __init__(self, spool_dir: str, pod_uid: str) -> None:
        self.path = os.path.join(spool_dir, STATE_DIR, STATE_FILE)
        self.pod_uid = pod_uid

    def load(self) -> set[str]:
        """The handled ids; empty on this pod's first start. Raises ``ValueError``/``OSError``
        when the file is there but unusable (the poster counts it; stable names prevent doubles).
        The file is as untrusted as any in the spool (``oomsight.wire.decoding``)."""
        try:
            doc = decoding.load(self.path, STATE_MAX_BYTES)
        except FileNotFoundError:
            return set()
        except decoding.Unusable as exc:
            raise ValueError(f"{self.path} is unusable ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("done"), list):
            raise ValueError(f"{self.path} is not a posted-events file")
        if doc.get("pod_uid") != self.pod_uid:
            return set()  # a spool carried over from another pod: its Events were about that pod
        return {x for x in doc["done"] if isinstance(x, str)}

    def save(self, done: set[str]) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        data = json.dumps({"schema_version": 1, "pod_uid": self.pod_uid, "done": sorted(done)}).encode()
        write_atomic(self.path, data, durable=False)


class EventPoster:
    """Posts one Event per new OOM event file; call :meth:`tick` periodically and once at exit."""

    def __init__(
        self,
        spool_dir: str,
        pod: KubernetesSettings,
        client_factory: Callable[[], KubeApi],
        reader: Optional[SpoolReader] = None,
    ) -> None:
        self.pod = pod
        self.reader = reader or SpoolReader(spool_dir, folders=(EVENTS,))
        """The events alone: their documents are held twice in the sidecar (here and in the collector's
        reader), which the reader's memory budget allows for (``oomsight.wire.reader.Budget``)."""
        self.state = PostedState(spool_dir, pod.pod_uid)
        self.results: Counter[str] = Counter(dict.fromkeys(RESULTS, 0))
        self.errors: Counter[str] = Counter(dict.fromkeys(ERROR_COMPONENTS, 0))
        self.done = self._load_state()
        self._factory = client_factory
        self._client: Optional[KubeApi] = None
        self._client_failed = False
        self._attempts: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(OOM events by result, swallowed errors by component) for the collector."""
        with self._lock:
            return dict(self.results), dict(self.errors)

    def tick(self) -> int:
        """Post what is new; return how many Events were posted now. Never raises: the loop
        that calls it must outlive any document."""
        with self._lock:
            try:
                new = [ev for ev in self.reader.read().events if oom_id(ev) not in self.done]
                posted = sum(self._handle_safely(ev) for ev in sorted(new, key=lambda e: e["time"]))
            except Exception as exc:  # a defect of ours: counted, and the next tick tries again
                self._count_failure("tick", exc)
                return 0
            if new:
                self._save()
            return posted

    def _handle_safely(self, ev: OomEvent) -> bool:
        """:meth:`_handle`, with a document that breaks it counted as failed (never retried)."""
        try:
            return self._handle(ev)
        except Exception as exc:
            self._count_failure("document", exc)
            try:
                return self._finish(oom_id(ev), "failed")
            except Exception:
                return False

    def _count_failure(self, what: str, exc: Exception) -> None:
        self.errors["events_document"] += 1
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(
                "oomsight sidecar: an OOM event could not become a Kubernetes Event (%s: %s); it is counted "
                'in oomsight_sidecar_errors_total{component="events_document"} and the poster carries on',
                type(exc).__name__,
                exc,
            )

    def _handle(self, ev: OomEvent) -> bool:
        oid = oom_id(ev)
        if self.results["posted"] >= self.pod.events_max:
            return self._finish(oid, "suppressed")
        client = self._connect()
        if client is None:
            return self._finish(oid, "failed")
        try:
            client.create_event(self.pod.pod_namespace, event_body(ev, self.pod))
        except KubeError as exc:
            if exc.status == 409:  # posted before the state file was written: the name is stable
                self._finish(oid, "posted")
                return False
            self.errors["events_api"] += 1
            self._attempts[oid] += 1
            self._warn_once(exc)
            if exc.transient and self._attempts[oid] < MAX_ATTEMPTS:
                return False
            return self._finish(oid, "failed")
        return self._finish(oid, "posted")

    def _finish(self, oid: str, result: str) -> bool:
        self.done.add(oid)
        self.results[result] += 1
        return result == "posted"

    def _connect(self) -> Optional[KubeApi]:
        if self._client is None and not self._client_failed:
            try:
                self._client = self._factory()
            except Exception as exc:  # not in a pod, no token, kubernetes not installed
                self._client_failed = True
                self.errors["kubernetes_client"] += 1
                logger.warning(
                    "oomsight sidecar: cannot reach the Kubernetes API (%s); OOMs are counted in metrics "
                    "but no Events are posted",
                    exc,
                )
        return self._client

    def _warn_once(self, exc: KubeError) -> None:
        key = str(exc.status)
        if key in self._warned:
            return
        self._warned.add(key)
        if exc.status == 403:
            logger.warning(
                "oomsight sidecar: not allowed to create Events in namespace %s (%s). Grant it with the chart: "
                "helm upgrade oomsight ./helm/oomsight --reuse-values --set 'rbac.podNamespaces={%s}'. "
                "OOMs are still counted in oomsight_oom_events_total.",
                self.pod.pod_namespace,
                exc.message,
                self.pod.pod_namespace,
            )
        else:
            logger.warning("oomsight sidecar: posting an OOM Event failed (%s); carrying on", exc)

    def _load_state(self) -> set[str]:
        try:
            return self.state.load()
        except (OSError, ValueError) as exc:
            self.errors["events_state"] += 1
            logger.warning("oomsight sidecar: ignoring %s (%s); Event names keep posts unique", self.state.path, exc)
            return set()

    def _save(self) -> None:
        try:
            self.state.save(self.done)
        except OSError as exc:
            self.errors["events_state"] += 1
            if "state" not in self._warned:
                self._warned.add("state")
                logger.warning("oomsight sidecar: cannot write %s (%s); Event names stay unique", self.state.path, exc)
