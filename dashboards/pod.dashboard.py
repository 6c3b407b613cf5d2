"""Workload / pod detail: per rank and GPU the memory timeline (allocated, reserved, NVML used,
capacity, a forecast), step peaks, memory by category, fragmentation, cudaMalloc retries,
memory outside PyTorch, the processes, the predicted peak against the measured one, the top
operators of the last profiling window, and OOMs as annotations with their diagnosis."""

from dashboards import config as c
from dashboards import panels as p
from dashboards import prediction_panels as prediction
from dashboards import queries as q

T = c.THRESHOLDS
HEADROOM = p.steps((p.RED, None), (p.ORANGE, T.near_capacity_warning_ratio), (p.GREEN, T.forecast_headroom_ratio))
FORENSICS_LINK = c.FORENSICS_LINK
TIME_TO_OOM = p.steps((p.RED, None), (p.ORANGE, 1800), (p.GREEN, 6 * 3600))

timeline = [
    (
        p.timeseries(
            "Allocated, reserved, NVML used and capacity",
            "Per rank and GPU: bytes in live tensors (allocated), bytes the caching allocator holds (reserved), "
            "device memory in use by every process (NVML used) and capacity (the process's memory-fraction cap "
            "where set, else the GPU's). The dashed forecast "
            f"extends the growth of the peak of allocated bytes over the last {T.forecast_lookback} by "
            f"{T.forecast_horizon_minutes} minutes: where it crosses capacity, an OOM is coming.",
            q.TIMELINE,
        ),
        14,
    ),
    (
        p.stat(
            "Headroom at the peak",
            "Share of what the process may use (the GPU, or its set_per_process_memory_fraction cap) still free at "
            "the highest sample of the last window, memory of other processes and of the CUDA context subtracted.",
            q.HEADROOM_NOW,
            "percentunit",
            HEADROOM,
        ),
        5,
    ),
    (
        p.stat(
            "Time to OOM (forecast)",
            "At the leak or growth the hook fitted on its step-resolved memory (floor and peak at every "
            "optimizer step), the time until the step peak reaches capacity; +Inf (shown as ∞) while "
            "memory does not rise (docs/diagnosis.md).",
            q.TIME_TO_OOM,
            "s",
            TIME_TO_OOM,
        ),
        5,
    ),
]

peaks = [
    (
        p.timeseries(
            "Step peaks and the between-steps floor",
            "Peak allocated bytes of the optimizer steps the hook read (step-resolved, torch's peaks never "
            "reset), allocated right after optimizer.step() (the between-steps floor: what survives between "
            "steps; a floor that keeps rising is a leak; older hooks: the lowest sample of each window) and "
            "the lifetime peak.",
            q.STEP_PEAKS,
        ),
        12,
    ),
    (
        p.timeseries(
            "Memory by category",
            "Parameters, gradients and optimizer state summed from the optimizers' tensors; activations are "
            "the step peak minus those three (a lower bound unless OOMSIGHT_STEP_PEAKS=1).",
            q.CATEGORIES,
            stack=True,
        ),
        12,
    ),
]

health = [
    (
        p.timeseries(
            "Fragmentation",
            "Inactive split bytes as a share of reserved bytes: free memory inside split blocks that no large "
            f"tensor can use and empty_cache() cannot release. Alert above {T.fragmentation_ratio:.0%}.",
            q.FRAGMENTATION,
            unit="percentunit",
            thresholds=p.steps((p.GREEN, None), (p.RED, T.fragmentation_ratio)),
        ),
        8,
    ),
    (
        p.timeseries(
            "cudaMalloc retries",
            "cudaMalloc failed and the allocator freed its whole cache to retry: each one stalls the step. "
            "Rising retries come before an OOM.",
            q.RETRIES,
            unit="none",
            bars=True,
        ),
        8,
    ),
    (
        p.timeseries(
            "Step time",
            "Mean time between optimizer steps. Steps slow down when the allocator retries or memory thrashes.",
            q.STEP_TIME,
            unit="s",
        ),
        8,
    ),
]

outside = [
    (
        p.timeseries(
            "Memory outside PyTorch",
            "NVML's memory of the process minus PyTorch's reserved bytes: CUDA context, NCCL buffers, cuBLAS and "
            "cuDNN workspaces, other CUDA libraries. Where NVML cannot see the process ID (most containers) it is "
            "device used minus reserved and includes other processes on the GPU.",
            q.NON_TORCH,
        ),
        12,
    ),
    (
        p.table(
            "Processes",
            "Each rank: running (1) or not, seconds since its last snapshot, why it ended, its torch version and "
            "whether expandable segments are on.",
            q.PROCESSES,
            {
                "namespace": "namespace",
                "pod": "pod",
                "rank": "rank",
                "Value #A": "Up",
                "Value #B": "Snapshot age",
                "reason": "Ended",
                "torch_version": "torch",
                "expandable_segments": "Expandable segments",
            },
            [p.column("Snapshot age", "s"), p.column("Up", thresholds=p.steps((p.RED, None), (p.GREEN, 1)))],
        ),
        12,
    ),
]

advice = [
    (
        p.stat(
            "Leak suspected",
            "1 where the memory that survives between steps rose in most windows of the recent stretch while steps "
            "ran (the same signal as the OomsightCudaMemoryLeakSuspected alert, without its 'for' delay). A "
            "suspected leak starts a scan for tensors kept alive with their autograd graph.",
            q.LEAK_SUSPECTED,
            "none",
            p.steps((p.GREEN, None), (p.RED, 1)),
        ),
        6,
    ),
    (
        p.timeseries(
            "Tensors alive with their autograd graph",
            "Bytes of CUDA tensors found alive past an optimizer step still holding a grad_fn (the classic "
            "outputs.append(model(x)) leak), from the last scan; the graph behind them holds far more. "
            "oomsight report names where they were created when allocation history is recorded.",
            q.LEAK_GRAPH,
        ),
        12,
    ),
    (
        p.stat(
            "Largest safe batch (probe)",
            "The answer of oomsight.probe_batch_size(): the largest batch that keeps the margin free, measured "
            "without provoking an OOM.",
            q.MAX_BATCH,
            "none",
            p.steps((p.GREEN, None)),
        ),
        6,
    ),
]


def profile_table(what: str, unit: str, description: str, queries: list[q.Query]) -> p.Panel:
    """The top operators of each rank's last profiling window by ``what``, largest first."""
    columns = {"pod": "pod", "rank": "rank", "op": "Operator", "Value": what}
    return p.table(
        f"Top operators by {what[0].lower()}{what[1:]}", description, queries, columns, [p.column(what, unit)]
    )


profiles = [
    (
        profile_table(
            "Self CUDA memory",
            "bytes",
            "From the last profiling window of each running rank (oomsight profile, the admin endpoint or a "
            "schedule; docs/profiling.md): the 10 operators that allocated the most CUDA memory themselves, the "
            "rest summed as other. Memory-only windows fill this table too.",
            q.PROFILE_MEMORY,
        ),
        12,
    ),
    (
        profile_table(
            "Self CUDA time",
            "s",
            "From the last profiling window of each running rank that traced CUDA time: the 10 operators with the "
            "most CUDA time of their own, the rest summed as other. After such a window the job runs slower until "
            "it ends (CUPTI stays attached); memory-only windows leave nothing here and cost nothing afterwards.",
            q.PROFILE_TIME,
        ),
        12,
    ),
]

oom_table = p.oom_table(
    "CUDA OOMs of these pods",
    "The last OOM of each rank and GPU in the time range: requested and free bytes, the diagnosed cause and the "
    "remedy that fits. The pod opens the forensics dashboard; the time, the pod's memory around the OOM.",
    q.OOM_TABLE,
    time_link=c.BEFORE_LINK,
    pod_link=FORENSICS_LINK,
)

dcgm = [
    (
        p.stat(
            "dcgm-exporter GPUs",
            "GPUs in this Prometheus for which dcgm-exporter serves framebuffer used, in either form: "
            "DCGM_FI_DEV_FB_USED (MiB, up to 4.8) or the bytes field of 4.9+ (docs/alerts.md, 'dcgm-exporter'). "
            "A note instead of a number: neither form is here, so the panels beside it stay empty.",
            q.DCGM_GPUS,
            "none",
            p.steps((p.GREEN, None)),
            no_value="neither DCGM_FI_DEV_FB_USED (MiB) nor a 4.9+ bytes field: dcgm-exporter not scraped",
        ),
        4,
    ),
    (
        p.timeseries(
            "dcgm-exporter framebuffer used and PyTorch reserved",
            "Per GPU of the selected pods, where NVIDIA dcgm-exporter runs: its framebuffer used "
            "(DCGM_FI_DEV_FB_USED in MiB up to 4.8, its 4.9+ bytes field, in bytes; every process on the GPU, "
            "the CUDA context included) next to "
            "the bytes PyTorch's caching allocators hold on it, joined on the GPU's UUID (dcgm's UUID label, "
            "oomsight's gpu_uuid). Empty without dcgm-exporter, and on MIG slices (dcgm labels them with the "
            "parent GPU's UUID).",
            q.DCGM_VS_RESERVED,
        ),
        12,
    ),
    (
        p.timeseries(
            "Outside PyTorch, as dcgm sees it",
            "dcgm-exporter's framebuffer used minus PyTorch reserved on the same GPU: CUDA contexts, NCCL "
            "buffers, other libraries and other processes. Agrees with 'Memory outside PyTorch' where NVML "
            "cannot see the process ID.",
            q.DCGM_OUTSIDE,
        ),
        8,
    ),
]

budget = [
    (
        p.timeseries(
            "Peak against the claimed GPU memory (DRA)",
            "Per GPU of the selected pods that claimed a share of a GPU's memory through DRA (ResourceClaim "
            "consumedCapacity, read by the sidecar with OOMSIGHT_RESOURCE_CLAIMS): the window peak of PyTorch "
            "reserved bytes over the pod's smallest claimed share. Above 100 % the pod uses memory promised to "
            "the GPU's other claims (OomsightGpuMemoryBudgetExceeded). Empty for pods without a claimed share.",
            q.BUDGET_USE,
            "percentunit",
            thresholds=p.steps((p.GREEN, None), (p.RED, T.budget_exceeded_ratio)),
        ),
        14,
    ),
    (
        p.timeseries(
            "Time until the claimed share is reached",
            "At the growth of that peak over the last 30 minutes, the seconds until it reaches the claimed share; "
            "only while it grows and is still below the share.",
            q.BUDGET_FORECAST,
            "s",
        ),
        10,
    ),
]

dashboard = p.dashboard(
    c.UID_POD,
    "oomsight / Workload and pod GPU memory",
    "GPU memory of the ranks of one workload or pod over time, and why it ran out.",
    [
        p.variable("namespace", "Namespace", q.NAMESPACES),
        p.variable("workload", "Workload", q.WORKLOADS),
        p.variable("pod", "Pod", q.PODS),
        p.variable("rank", "Rank", q.RANKS),
        p.variable("device", "GPU", q.DEVICES),
    ],
    q.OOM_ANNOTATION_POD,
    [
        "Memory timeline",
        (10, timeline),
        (8, peaks),
        "Allocator health",
        (8, health),
        "Outside PyTorch, and the processes",
        (8, outside),
        "Measured advice: leaks and batch size",
        (6, advice),
        "Prediction: predicted vs measured peak (oomsight predict)",
        (8, prediction.ROW),
        "Profiles: the last window of each rank",
        (8, profiles),
        "CUDA out-of-memory errors",
        (6, [(oom_table, 24)]),
        p.Collapsed(
            "Shared GPUs: dcgm-exporter's view and DRA memory budgets (open where they run)", [(8, dcgm), (8, budget)]
        ),
    ],
    q.CLUSTERS,
)
