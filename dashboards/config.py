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
    """A CUDA OOM keeps ``OomsightCudaOutOfMemory`` firing (and its recorded event alive) this long."""
    near_capacity_warning_ratio: float = 0.10
    """Headroom (memory left at the window peak) below this share of ``CAPACITY``: warning."""
    near_capacity_warning_for: str = "15m"
    near_capacity_critical_ratio: float = 0.03
    """Below this share: an OOM can come with any larger batch or longer sequence."""
    near_capacity_critical_for: str = "5m"
    forecast_lookback: str = "30m"
    """Hooks without step rows: growth of the window peak of allocated bytes is fitted over this much history."""
    forecast_horizon_minutes: int = 30
    """``OomsightCudaOomPredicted`` fires when the fitted growth reaches capacity within this horizon..."""
    forecast_headroom_ratio: float = 0.25
    """... and headroom is already below this share (a slope alone never fires)."""
    forecast_for: str = "2m"
    """The hook's own forecast is fitted on step rows: a short hold, so a fast leak pages in minutes."""
    leak_for: str = "2m"
    """``oomsight_leak_suspected`` is already judged over many steps by the hook's rows."""
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
    webhook_certificate_days: int = 7
    """The webhook's serving certificate expires within this many days (it renews 30 days ahead)."""
    webhook_certificate_for: str = "1h"
    webhook_errors_window: str = "10m"
    webhook_errors_min: int = 1
    """Admission requests answered with an error (a bug: the pod was admitted without the sidecar)."""
    webhook_errors_for: str = "5m"
    webhook_down_for: str = "10m"
    budget_exceeded_ratio: float = 1.0
    """A pod's peak reserved bytes on a GPU above this share of the GPU memory it claimed through DRA
    (ResourceClaim consumedCapacity): past 1 it uses memory promised to the GPU's other claims, which
    nothing inside CUDA stops (docs/alerts.md, "GPU memory budgets")."""
    budget_exceeded_for: str = "5m"
    """Several window peaks above the share, not one spike: the neighbours' own peaks may not coincide."""
    rightsizing_window: str = "7d"
    """Right-sizing: the runs a workload's recommended GPU memory covers (the highest need within it). A week
    holds a weekly pattern (a nightly job's longest input, a Monday retrain); ``oomsight recommend --window``
    picks another at query time."""
    rightsizing_margin_ratio: float = 0.10
    """Right-sizing: the recommendation is the window's highest need times (1 + this). The need is already the
    exact lifetime peak reserved plus the memory outside the allocator, not a sample, so the margin covers
    what the window did not see (a longer sequence, a new driver's larger context), not sampling error."""
    claim_below_peak_ratio: float = 1.0
    """``OomsightGpuMemoryClaimBelowPeak``: a pod's DRA claim below this share of its workload's observed need
    over the window (1: below the need itself, margin not counted)."""
    claim_below_peak_for: str = "5m"
    claim_oversized_factor: float = 2.0
    """``OomsightGpuMemoryClaimOversized``: a claim more than this many times the workload's observed need over a
    whole window: half of it idles at the workload's worst moment in a week."""
    claim_oversized_for: str = "1h"
    prediction_margin_ratio: float = 0.10
    """``OomsightPeakAbovePrediction``: a rank's measured lifetime peak allocated above the peak ``oomsight
    predict`` gave its job by more than this share. The predictor's worst under-prediction measured on the H200
    is -1.2 % (docs/prediction.md), and predict sizes a job with 10 % of the capacity kept free: a job 10 % over
    its prediction has used up the margin it was sized with, which no measured error of the predictor explains."""
    prediction_exceeded_for: str = "5m"
    """The lifetime peak only rises (oomsight never resets it), so the hold only asks that both series agree over
    a few scrapes; the same job keeps firing while it runs."""


THRESHOLDS = Thresholds()

SIDECAR_UP_SELECTOR = 'container=~"oomsight.*"'
"""The sidecar's ``up`` series where the scrape sets ``container`` (the chart's PodMonitor)."""
SIDECAR_POD_LABEL_SELECTOR = 'oomsight_io_inject="true"'
"""The same where pod labels are mapped onto targets (``labelmap`` of ``__meta_kubernetes_pod_label_(.+)``,
as the Prometheus community chart's annotation-based ``kubernetes-pods`` job does)."""
SIDECAR_SEEN = "oomsight_build_info"
"""Only the sidecar serves this: a target that served it within ``SIDECAR_SEEN_LOOKBACK`` is a sidecar,
whatever labels the scrape config gives it."""
SIDECAR_SEEN_LOOKBACK = "1h"
WEBHOOK_UP_SELECTOR = 'container="webhook", service=~".*oomsight.*"'
"""The webhook's ``up`` series through the chart's ServiceMonitor (``service``: the webhook Service,
named after the release)."""
WEBHOOK_SEEN = "oomsight_webhook_admissions_total"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
"""dcgm-exporter's framebuffer used up to 4.8.x, in MiB, labelled ``UUID`` (the GPU's), ``gpu`` (the host's index)
and ``device`` (``nvidia0``: the device node, not the CUDA index oomsight's ``device`` is). Verified in
``etc/default-counters.csv`` at every stored tag up to ``4.5.3-4.8.2`` (docs/alerts.md, "dcgm-exporter")."""
DCGM_FB_USED_BYTES = '{__name__=~"DCGM_FI_DEV_FB_USED_.+", __name__!~".*_(PERCENT|RATIO)"}'
"""dcgm-exporter 4.9+'s framebuffer used, in bytes (4.9.0 renamed the fields DCGM 4.7 deprecates and moved GPU
memory from MiB to bytes). Its exact new name was not in the stored copies (they end at 4.8.2; the release
notes read name only the new ``DCGM_FI_DEV_FB_CAPACITY_BYTES``), so this matches any renamed framebuffer-used
field but DCGM's ``DCGM_FI_DEV_FB_USED_PERCENT`` ratio; docs/alerts.md says what was verified."""
MIB = 1 << 20
OOM_LOOKBACK = "10m"
"""Recorded OOM events and pod owners outlive a pod this long, so a pod that dies right after its
OOM still gets its alert, annotation and forensics row."""

RUNBOOK_URL = "https://github.com/oomsight/oomsight/blob/main/docs/runbooks"
"""Base of every alert's runbook_url (``<base>/<alert, lower case>.md``); the chart's
``prometheusRule.runbookUrl`` overrides it."""
RUNBOOK_URL_PATTERN = RUNBOOK_URL + "/{alert}.md"
"""``{alert}`` is the lower-cased alert name; ``python -m dashboards --runbook-url-pattern`` overrides it."""

CAPACITY = "(oomsight_torch_memory_limit_bytes or oomsight_gpu_memory_total_bytes)"
"""What a process may use on a device: its set_per_process_memory_fraction cap, else the whole GPU."""
HEADROOM_RATIO = f"oomsight_gpu_headroom_bytes / {CAPACITY}"
"""Share of what the process may use still free at the window's peak."""

# Label sets PromQL joins on. Prometheus adds namespace/pod from the scrape target; ``cluster`` is
# there only in multi-cluster setups (kubernetes-mixin's convention); a label that is absent on
# both sides of a join or aggregation is simply empty.
POD = "cluster, namespace, pod"
PROCESS = "cluster, namespace, pod, rank, local_rank"
DEVICE = "cluster, namespace, pod, rank, local_rank, device, gpu_uuid"
WORKLOAD = "cluster, namespace, workload, workload_type"
EVENT = "cluster, namespace, workload, workload_type, pod, rank, local_rank, device, gpu_uuid"
OWNER_LABELS = "workload, workload_type"

UID_CLUSTER = "oomsight-cluster"
UID_POD = "oomsight-pod"
UID_FORENSICS = "oomsight-forensics"
TAGS = ["oomsight", "gpu", "cuda-memory"]
KEEP = "${datasource:queryparam}&${cluster:queryparam}"
"""What every link to another oomsight dashboard carries: the data source and the cluster."""
BEFORE_LINK = (
    f"/d/{UID_POD}/?{KEEP}&var-namespace=${{__data.fields.namespace}}&var-pod=${{__data.fields.pod}}"
    "&var-rank=${__data.fields.rank}&time=${__value.raw}&time.window=1800000"
)
"""From an OOM's time (in ms) to the pod dashboard, 15 minutes either side of it."""
POD_LINK = (
    f"/d/{UID_POD}/?{KEEP}&var-namespace=${{__data.fields.namespace}}&var-pod=${{__data.fields.pod}}"
    "&${__url_time_range}"
)
"""From a pod in a table to the pod dashboard, with the same time range."""
FORENSICS_LINK = (
    f"/d/{UID_FORENSICS}/?{KEEP}&var-namespace=${{__data.fields.namespace}}&var-pod=${{__data.fields.pod}}"
    "&${__url_time_range}"
)
SCHEMA_VERSION = 39
DEFAULT_TIME = "now-3h"
REFRESH = "30s"

# Short remedy per diagnosed cause (oomsight.analysis.diagnosis.CAUSES), shown in annotations, the OOM
# table and alert descriptions. docs/diagnosis.md and the runbooks hold the full text. A remedy that only
# moves memory comes first; one that changes what the job computes says so (tests/test_remedy_classes.py).
CAUSE_REMEDY = {
    "oversized_request": "one tensor is too large: chunk the loss/logits (same result), or a smaller batch with "
    "accumulation",
    "other_process": "another process holds this GPU: give the job a GPU of its own",
    "non_pytorch_memory": "memory outside PyTorch (NCCL buffers, CUDA libraries): lower NCCL_BUFFSIZE",
    "leak": "tensors kept alive with their graph across steps or micro-batches: log loss.item(), clear output "
    "lists, reduce each micro-batch's outputs as they come",
    "fragmentation": "set PYTORCH_ALLOC_CONF=expandable_segments:True, keep shapes stable",
    "growing_demand": "the input grew past what fitted: micro-batches of what fitted with gradient accumulation (the "
    "same effective batch), activation checkpointing; an MoE's capacity factor changes the routing, truncating "
    "sequences changes what the job learns from",
    "activations": "activations do not fit: activation checkpointing, a smaller batch with accumulation; bf16 autocast "
    "changes the result (bf16 rounding)",
    "model_states": "parameters, gradients and optimizer state fill the GPU: FSDP/ZeRO or optimizer-state offload; "
    "bf16 params or a lighter optimizer change the result",
    "exhaustion": "a smaller batch with gradient accumulation, activation checkpointing; bf16 autocast changes the "
    "result (bf16 rounding)",
}
