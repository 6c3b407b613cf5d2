"""OOM forensics: every CUDA OOM in the time range with its time, pod, rank, requested and free
bytes, diagnosed cause and remedy, and the minutes of memory history before it."""

from dashboards import config as c
from dashboards import panels as p
from dashboards import queries as q

last = p.oom_table(
    "Last CUDA OOM of each rank and GPU",
    "Time, pod, rank and GPU of the last OOM in the time range; the size of the allocation that failed and the bytes "
    "the device had free; the diagnosed cause and its remedy; OOMs and fatal OOMs counted over the pod's life. "
    "Click the time to open the pod's memory 15 minutes either side of it.",
    q.OOM_TABLE,
    time_link=c.BEFORE_LINK,
)

log = p.table(
    "Every CUDA OOM in the time range",
    "One row per OOM: each new value of a rank's last-OOM timestamp is one event, so a rank that restarts and runs "
    "out of memory again shows once per OOM. Click the time to open the pod's memory around it.",
    q.OOM_LOG,
    {
        "Value": "OOM time",
        "namespace": "namespace",
        "pod": "pod",
        "rank": "rank",
        "device": "GPU",
        "cause": "Cause",
        "remedy": "Remedy",
    },
    [p.column("OOM time", "dateTimeAsIso", link=c.BEFORE_LINK)],
    group_by_value=True,
)

before = [
    (
        p.timeseries(
            "Allocated and reserved before the OOM",
            "Memory of the ranks and GPUs that ran out in the time range: live tensors, the allocator's "
            "reserve, the between-steps floor (rising = leak) and capacity. The red marks are the OOMs.",
            q.BEFORE_MEMORY,
        ),
        24,
    ),
]

allocator = [
    (
        p.timeseries(
            "Fragmentation and memory outside PyTorch before the OOM",
            "Inactive split bytes (fragmentation) and memory outside PyTorch's allocator (CUDA context, NCCL, "
            "other processes) of the ranks and GPUs that ran out.",
            q.BEFORE_ALLOCATOR,
        ),
        12,
    ),
    (
        p.timeseries(
            "cudaMalloc retries before the OOM",
            "Cache flushes of the allocator of the ranks and GPUs that ran out: they usually start minutes "
            "before the OOM.",
            q.BEFORE_RETRIES,
            unit="none",
            bars=True,
        ),
        12,
    ),
]

dashboard = p.dashboard(
    c.UID_FORENSICS,
    "oomsight / CUDA OOM forensics",
    "Every CUDA out-of-memory error: when, where, how much was asked for and free, why, the remedy, and the minutes "
    "before it.",
    [
        p.variable("namespace", "Namespace", q.NAMESPACES),
        p.variable("workload", "Workload", q.WORKLOADS),
        p.variable("pod", "Pod", q.PODS),
    ],
    q.OOM_ANNOTATION_POD,
    [
        "CUDA OOM events",
        (7, [(last, 24)]),
        (7, [(log, 24)]),
        "The minutes before each OOM",
        (9, before),
        (8, allocator),
    ],
    q.CLUSTERS,
)
