"""Every number, selector, name and link of the dashboards and alerts, in one place.

Change a value here, run ``make dashboards`` and commit the generated files
(``helm/oomsight/dashboards/*.json``, ``helm/oomsight/rules/oomsight.rules.yaml``);
``make test`` fails while they drift. ``docs/alerts.md`` explains each threshold.
"""

from __future__ import annotations

import dataclasses

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Alert thresholds and durations (PromQL duration strings), also used to colour panels."""

    oom_recent_seconds: int = 600
    """A CUDA OOM keeps ``CudaOutOfMemory`` firing (and its recorded event alive) this long."""
    near_capacity_warning_ratio: float = 0.10
    """Headroom (memory left at the window peak) below this share of ``CAPACITY``: warning."""
    near_capacity_warning_for: str = "15m"
    near_capacity_critical_ratio: float = 0.03
    """Below this share: an OOM can come with any larger batch or longer sequence."""
    near_capacity_critical_for: str = "5m"
    forecast_lookback: str = "30m"
    """Growth of the window peak of allocated bytes is fitted over this much history."""
    forecast_horizon_minutes: int = 30
    """``CudaOomPredicted`` fires when the fitted growth reaches capacity within this horizon..."""
    forecast_headroom_ratio: float = 0.25
    """... and headroom is already below this share (a slope alone never fires)."""
    forecast_for: str = "10m"
    leak_window: str = "10m"
    """The between-steps floor must rise across three consecutive windows of this length."""
    leak_min_growth_ratio: float = 0.05
    """... by at least this share of ``CAPACITY`` over the three windows."""
    leak_for: str = "10m"
    fragmentation_ratio: float = 0.30
    """Inactive split bytes above this share of reserved bytes..."""
    fragmentation_min_bytes: int = GIB
    """... and above this many bytes (small jobs never fire)."""
    fragmentation_for: str = "15m"
    retries_window: str = "15m"
    retries_min: int = 3
    """At least this many cudaMalloc retries (cache flushes) within ``retries_window``."""
    retries_for: str = "5m"
    sidecar_down_for: str = "5m"
    hook_silent_for: str = "2m"
    """Kept below the sidecar's retention (300 s), after which a silent process's series vanish."""
    hook_missing_for: str = "30m"
    """A sidecar with no publishing process: data loading before the first CUDA call can take a while."""
    underused_peak_ratio: float = 0.20
    """Peak reserved bytes below this share of the GPU for ``underused_window``: waste."""
    underused_window: str = "3h"
    underused_for: str = "30m"
    busy_ratio: float = 0.90
    """Panels colour a GPU red once its peak uses this share (1 - near_capacity_warning_ratio)."""


THRESHOLDS = Thresholds()

SIDECAR_UP_SELECTOR = 'container=~"oomsight.*"'
"""Selects the sidecar's ``up`` series; PodMonitor and pod service discovery both set ``container``."""
OOM_LOOKBACK = "10m"
"""Recorded OOM events and pod owners outlive a pod this long, so a pod that dies right after its
OOM still gets its alert, annotation and forensics row."""

RUNBOOK_URL_PATTERN = "https://github.com/oomsight/oomsight/blob/main/docs/runbooks/{alert}.md"
"""``{alert}`` is the lower-cased alert name; ``python -m dashboards --runbook-url-pattern`` overrides it."""

CAPACITY = "(oomsight_torch_memory_limit_bytes or oomsight_gpu_memory_total_bytes)"
"""What a process may use on a device: its set_per_process_memory_fraction cap, else the whole GPU."""
HEADROOM_RATIO = f"oomsight_gpu_headroom_bytes / {CAPACITY}"
"""Share of what the process may use still free at the window's peak."""

# Label sets PromQL joins on. Prometheus adds namespace/pod from the scrape target.
POD = "namespace, pod"
PROCESS = "namespace, pod, rank, local_rank"
DEVICE = "namespace, pod, rank, local_rank, device, gpu_uuid"
WORKLOAD = "namespace, workload, workload_type"
EVENT = "namespace, workload, workload_type, pod, rank, local_rank, device, gpu_uuid"
OWNER_LABELS = "workload, workload_type"

UID_CLUSTER = "oomsight-cluster"
UID_POD = "oomsight-pod"
UID_FORENSICS = "oomsight-forensics"
TAGS = ["oomsight", "gpu", "cuda-memory"]
BEFORE_LINK = (
    f"/d/{UID_POD}/?var-namespace=${{__data.fields.namespace}}&var-pod=${{__data.fields.pod}}"
    "&var-rank=${__data.fields.rank}&time=${__value.raw}&time.window=1800000"
)
"""From an OOM's time (in ms) to the pod dashboard, 15 minutes either side of it."""
SCHEMA_VERSION = 39
DEFAULT_TIME = "now-3h"
REFRESH = "30s"

# Short remedy per diagnosed cause (oomsight.analysis.diagnosis.CAUSES), shown in annotations, the OOM
# table and alert descriptions. docs/diagnosis.md and the runbooks hold the full text.
CAUSE_REMEDY = {
    "oversized_request": "one tensor is too large: chunk the loss/logits, or lower the batch size",
    "other_process": "another process holds this GPU: give the job a GPU of its own",
    "non_pytorch_memory": "memory outside PyTorch (NCCL buffers, CUDA libraries): lower NCCL_BUFFSIZE",
    "leak": "tensors kept alive with their graph across steps: log loss.item(), clear output lists",
    "fragmentation": "set PYTORCH_ALLOC_CONF=expandable_segments:True, keep shapes stable",
    "exhaustion": "lower the batch size (gradient accumulation), bf16 autocast, activation checkpointing",
}
