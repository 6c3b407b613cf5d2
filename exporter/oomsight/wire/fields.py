"""The one table of the spool's documents: every key, its type, whether a reader needs it,
the revision it appeared in and what it means.

Everything else is read off these tables: validation (``oomsight.wire.schema``), the
``TypedDict`` s the code is typed with (``oomsight.wire.documents``, generated), the JSON
Schema (``docs/spool-schema.json``) and the field lists of ``docs/spool-format.md``
(``python -m oomsight.wire.rendering`` writes them, ``--check`` fails on drift).

Rules (``docs/spool-format.md``, "Versioning"):

- readers accept unknown keys;
- revision ``"1"`` is what the shipped H200 tape holds; a key of a table may be required only
  if it is there since the table itself (an older writer of the same schema version lacks
  every later key), so every key added later is optional, with a ``default`` readers see;
- a newer ``schema_version`` is skipped and counted (``future_version``).
"""

from __future__ import annotations

from oomsight.wire.fieldtypes import (
    AT_OOM,
    CENSUS,
    CONSUMED,
    FORECAST,
    FORWARDS,
    JUDGED,
    LATER,
    LAYOUT,
    OBSERVED,
    OUTCOME_CHOICES,
    PREDICTED,
    STEP_MEMORY,
    Table,
    nullable,
    opt,
    req,
)

PROCESS = Table(
    "ProcessInfo",
    "Who wrote the document: one process start.",
    (
        req("id", "str", 'unique per process start: "<pid>-<8 random hex digits>"'),
        req("pid", "int", "the process id in its container's PID namespace"),
        opt("hostname", "str", "the host (pod) name", default=""),
        req("rank", "int", "RANK of torch.distributed (0 without it)"),
        req("local_rank", "int", "LOCAL_RANK (0 without it)"),
        opt("world_size", "int", "WORLD_SIZE (1 without it)", default=1),
        req("started_at", "time", "when the hook started, Unix seconds"),
        opt("argv0", "str", "the program's file name", default=""),
        opt("torch_version", "str", "torch.__version__", default="", label=True),
        opt("cuda_version", "str", "torch.version.cuda", default="", label=True),
        opt("oomsight_version", "str", "the hook's oomsight version", default="", label=True),
        opt("allocator_backend", "str", '"native" or "cudaMallocAsync"', default="", label=True),
        opt("expandable_segments", "bool", "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True", default=False),
    ),
)
ALLOCATOR = Table(
    "AllocatorSample",
    "torch.cuda.memory_stats() of one device, all in bytes or counts.",
    (
        req("allocated_bytes", "int", "bytes in live tensors (allocated_bytes.all.current)"),
        req("reserved_bytes", "int", "bytes held by the caching allocator"),
        req("active_bytes", "int", "bytes in active blocks, frees awaiting other streams included"),
        req("requested_bytes", "int", "bytes tensors asked for, before rounding"),
        req("inactive_split_bytes", "int", "free bytes inside split segments: fragmentation"),
        req("peak_allocated_bytes", "int", "lifetime peak (since the last reset by anybody)"),
        req("peak_reserved_bytes", "int", "lifetime peak of reserved bytes"),
        req("window_peak_allocated_bytes", "int", "maximum sampled within the sliding window"),
        req("window_peak_reserved_bytes", "int", "maximum sampled reserved bytes within the window"),
        req("window_min_allocated_bytes", "int", "trough within the window: persistent memory"),
        req("alloc_retries", "int", "cudaMalloc failures after which the allocator freed its cache", counter=True),
        req("ooms", "int", "OOMs the allocator counted", counter=True),
        req("device_allocs", "int", "cudaMalloc calls", counter=True),
        req("device_frees", "int", "cudaFree calls", counter=True),
        opt("allocated_total_bytes", "int", "bytes ever allocated (allocated_bytes.all)", default=0, since=JUDGED),
    ),
)
NVML = Table(
    "NvmlSample",
    "What NVML says about the device.",
    (
        req("total_bytes", "int", "device memory (NVML total)"),
        req("used_bytes", "int", "device memory in use by anybody"),
        req("free_bytes", "int", "device memory free"),
        nullable("reserved_bytes", "int", "driver/firmware reserved (nvmlMemory_v2)"),
        nullable("utilization_ratio", "number", "GPU utilization, 0..1"),
        nullable("process_used_bytes", "int", "this process's own NVML entry, when its PID is visible"),
        req("process_visible", "bool", "NVML lists this process (same PID namespace)"),
        nullable("other_processes", "int", "compute processes NVML lists besides this one"),
    ),
)
STATES_LAYOUT = (
        opt(
            "frozen_parameters_bytes", "int", "of the parameters, those no optimizer trains (requires_grad false)",
            default=0, since=LAYOUT,
        ),
        opt(
            "quantized_parameters_bytes", "int", "of the parameters, those in a quantised storage",
            default=0, since=LAYOUT,
        ),
        opt(
            "gradient_buckets_bytes", "int", "of the gradients, DDP's bucket copies (0: gradients are views of them)",
            default=0, since=LAYOUT,
        ),
        opt(
            "unsharded_parameters_bytes", "int", "all-gathered (unsharded) FSDP parameters alive besides the shards",
            default=0, since=LAYOUT,
        ),
        opt("adapter_parameters_bytes", "int", "of the parameters, adapter (LoRA) weights", default=0, since=LAYOUT),
        opt(
            "expert_parameters_bytes", "int", "of the parameters, a mixture of experts' experts (named expert...)",
            default=0, since=OBSERVED,
        ),
        opt(
            "untrained_gradients_bytes", "int",
            "of the gradients, those of parameters no optimizer trains (a model left with requires_grad on)",
            default=0, since=LAYOUT,
        ),
        opt(
            "frozen_modules", "list", "top-level modules whose parameters are all frozen, largest first (at most 8)",
            items="str", since=LAYOUT,
        ),
)
"""What both the snapshot's categories and an OOM's model states say of the parameters' layout."""
CATEGORIES = Table(
    "Categories",
    "Device memory by category, summed from the optimizers' tensors.",
    (
        req("parameters_bytes", "int", "parameters of the optimizers' groups"),
        req("gradients_bytes", "int", "their .grad tensors"),
        req("optimizer_state_bytes", "int", "the optimizers' state tensors"),
        nullable("activations_bytes", "int", "peak minus the three above; null before a peak is known", required=True),
        req("basis", "str", '"step_peak" (opt-in, exact) or "window_peak" (sampled, a lower bound)'),
        opt("measured_at", "time", "when the categories were summed", default=0.0),
        nullable(
            "optimizer_state_expected_bytes",
            "int",
            "state bytes the optimizers will hold once initialised (null: unknown)",
            since=STEP_MEMORY,
        ),
        *STATES_LAYOUT,
    ),
)
STEP_PEAK = Table(
    "StepPeak",
    "The exact peak of the last step (OOMSIGHT_STEP_PEAKS=1).",
    (req("allocated_bytes", "int", "peak allocated bytes"), req("reserved_bytes", "int", "peak reserved bytes")),
)
PREDICTION = Table(
    "PeakPrediction",
    "The peak a prediction gave for the job's training step (oomsight predict), carried by the job.",
    (
        req("peak_allocated_bytes", "int", "predicted max_memory_allocated() of the training steps"),
        nullable("peak_reserved_bytes", "int", "predicted max_memory_reserved() (null: not given, e.g. a bare size)"),
        req("source", "str", '"env" (OOMSIGHT_PREDICTION) or "api" (oomsight.record_prediction)'),
        nullable("model", "str", "the model it was made for, where known"),
        nullable("batch_size", "int", "the batch size it was made for, where known"),
        req("recorded_at", "time", "when the hook took it"),
    ),
    since=PREDICTED,
)
STEP_TREND = Table(
    "StepTrend",
    "The hook's verdict on every step row it keeps (oomsight.analysis.trend), judged at each publish.",
    (
        req("points", "int", "rows judged (past warm-up)"),
        req("leak", "bool", "the between-steps floor rises step after step and the step's own memory does not"),
        req("floor_slope_bytes", "number", "bytes per step the floor rose, least squares over the judged rows"),
        req("floor_growth_bytes", "int", "growth of the floor over the judged rows"),
        nullable(
            "steps_to_oom", "number", "steps until the peak reaches capacity (central); null: no forecast, or one "
            "too noisy to time (no_forecast_reason)", required=True,
        ),
        nullable("seconds_to_oom", "number", "the same in seconds at the current step time", required=True),
        nullable(
            "earliest_seconds_to_oom", "number",
            "the earliest plausible seconds to OOM, from the rows' own noise (at most seconds_to_oom); also "
            'given where the central time is not ("too_noisy": when the OOM comes is chance beyond the bar); '
            "null: no forecast", since=FORECAST,
        ),
        opt(
            "forecast_kind", "str",
            'what the forecast is made for: "steady_leak", "stair_leak" or "growing_demand" (readers accept '
            'others); "" without a forecast (one too noisy to time keeps its kind), or from a writer older than 1.9',
            default="", since=FORECAST,
        ),
        opt(
            "no_forecast_reason", "str",
            'why there is no forecast: "too_short", "too_noisy" (the slope not told from noise, or, with an '
            'earliest time, when the OOM comes is chance beyond the bar), "no_rise" or "no_step_time" (readers '
            'accept others); "" with one, or from a writer older than 1.9', default="", since=FORECAST,
        ),
    ),
    since=JUDGED,
)
STEPS_MEMORY_DOC = (
    "by step, oldest first: rows [step, time, floor_bytes, peak_bytes, reserved_bytes, exact]"
    " and, since 1.6, outside_bytes (NVML process memory minus reserved; -1: unknown); since 1.10, held_bytes"
    " (gradients and optimizer state the optimizers hold; -1: unknown) and input_elements (the most elements one"
    " forward of the outermost model took in since the row before; -1: unknown)"
)
DEVICE = Table(
    "DeviceSnapshot",
    "One CUDA device the process uses.",
    (
        req("index", "int", "the CUDA device index"),
        req("uuid", "str", "the GPU's UUID (GPU-...)", label=True),
        opt("name", "str", "the GPU model", default="", label=True),
        opt("total_bytes", "int", "capacity as torch sees it (get_device_properties().total_memory)", default=0),
        nullable("limit_bytes", "int", "cap of set_per_process_memory_fraction; null if unset", since=LATER),
        req("allocator", "object", "the caching allocator's statistics", table=ALLOCATOR),
        nullable("nvml", "object", "null when NVML is unavailable", table=NVML),
        nullable("categories", "object", "null before the optimizers are known", table=CATEGORIES),
        nullable("step_peak", "object", "null unless OOMSIGHT_STEP_PEAKS=1", table=STEP_PEAK),
        opt(
            "trend",
            "list",
            "rows [time, window_min_allocated_bytes, steps], oldest first, at most 64; since 1.5 none with step_trend",
            items="row",
        ),
        opt(
            "steps_memory",
            "list",
            STEPS_MEMORY_DOC + "; since 1.5 only the last row, judged in step_trend",
            items="row",
            since=STEP_MEMORY,
        ),
        nullable("prediction", "object", "the job's predicted peak on this device", table=PREDICTION, since=PREDICTED),
        nullable("step_trend", "object", "the hook's verdict on its step rows", table=STEP_TREND, since=JUDGED),
        opt(
            "forward_pile_bytes",
            "int",
            "how far the memory left after each forward that recorded an autograd graph rose as a leak makes it "
            "rise, with no optimizer step since (the hook's verdict on its forward rows); absent without a rise",
            default=0, since=FORWARDS,
        ),
    ),
)
STEPS = Table(
    "StepInfo",
    "Optimizer steps seen by the global step hook.",
    (
        req("count", "int", "steps so far", counter=True),
        req("duration_seconds_total", "number", "sum of the times between consecutive steps", counter=True),
        nullable("last_duration_seconds", "number", "time between the last two steps"),
        nullable("last_step_time", "time", "when the last step ended"),
    ),
)
BATCH_ADVICE = Table(
    "BatchAdvice",
    "The answer of oomsight.probe_batch_size (or of observed steps).",
    (
        req("measured_at", "time", "when it was measured"),
        req("device", "int", "the device"),
        req("max_batch_size", "int", "largest batch that keeps the margin"),
        req("margin_ratio", "number", "share of capacity kept free"),
        req("capacity_bytes", "int", "the capacity it was fitted against"),
        req("fixed_bytes", "number", "fitted peak at batch size 0 (parameters, gradients, optimizer state, ...)"),
        req("bytes_per_sample", "number", "fitted peak growth per sample"),
        req("points", "list", "[[batch_size, peak_bytes], ...] measured", items="row"),
        req("source", "str", '"probe" or "observed"'),
    ),
    since=LATER,
)
PARALLELISM = Table(
    "Parallelism",
    "How the job spreads its model over processes, as the hook found it in the live modules.",
    (
        req("world_size", "int", "ranks of the default process group (1 without torch.distributed)"),
        req(
            "strategy", "str", "the data-parallel wrapper in use",
            choices=("none", "ddp", "fsdp", "fsdp2", "zero", "dtensor"),
        ),
        nullable("zero_stage", "int", "DeepSpeed ZeRO stage 0-3; 1 also for torch's ZeroRedundancyOptimizer"),
        nullable(
            "sharding", "str",
            "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or _HYBRID_SHARD_ZERO2 (FSDP2: by its reshard setting)",
        ),
        nullable("shard_size", "int", "ranks one parameter is sharded over"),
        nullable(
            "reshard_after_forward", "any",
            "FSDP2: true frees the gathered parameters after forward; an integer N reshards them to groups of N ranks, "
            "kept until the backward; false keeps them (bool; an integer since 1.11)",
        ),
        nullable("gradient_as_bucket_view", "bool", "DDP: gradients are views of the buckets"),
        nullable("offload", "bool", "parameters or optimizer state live on the CPU"),
        nullable(
            "mixed_precision", "str",
            "the dtype the wrapper computes in (FSDP2's MixedPrecisionPolicy.param_dtype, FSDP1's or DDP's "
            'MixedPrecision, DeepSpeed bf16/fp16), e.g. "bfloat16"; null: none',
            since=FORECAST,
        ),
    ),
    since=LAYOUT,
)
CENSUS_HOLDER = Table(
    "CensusHolder",
    "What holds tensors on the device outside the model states, the largest first.",
    (
        req("name", "str", 'how the job reaches it: "local `all_logits` of validate (train.py:42)", "Model.attn.last"'),
        req("kind", "str", "list, tuple, dict, set, frozenset, deque, attribute (one tensor) or kv_cache"),
        nullable("framework", "str", "the package whose code holds it (transformers), null: the job's own code"),
        req("graph_tensors", "int", "tensors it holds that carry an autograd graph"),
        req("detached_tensors", "int", "tensors it holds without a graph"),
        req("bytes", "int", "their storages' bytes"),
        nullable("length", "int", "the container's length"),
        nullable("cap", "int", "a deque's maxlen: it never holds more"),
        opt(
            "parameter_copies", "bool", "every tensor has a parameter's shape and no graph (EMA, snapshots)",
            default=False,
        ),
        opt(
            "reached_by", "str", "how the job reaches it: local, global, module (a model's path), class (only its "
            "class: no name of the job's leads to it), none; empty: not said",
            default="",
        ),
    ),
    since=CENSUS,
)
LEAK = Table(
    "LeakFinding",
    "Tensors that survived an optimizer step still holding their autograd graph.",
    (
        req("checked_at", "time", "when the scan ran"),
        req("step", "int", "the step it ran after"),
        req("graph_tensors", "int", "CUDA tensors with a grad_fn alive at the step boundary"),
        req("graph_bytes", "int", "their storage bytes, each storage once"),
        nullable("growth_bytes", "int", "growth of the between-steps floor that triggered the check"),
        req("sites", "list", 'where the largest were allocated (needs history), "file:line in fn"', items="str"),
        opt(
            "holders", "list", "what held tensors outside the model states at the scan (the census), the largest "
            "first, at most 8", table=CENSUS_HOLDER, since=CENSUS,
        ),
        nullable(
            "bounded_by", "str", "a bounded holder (a deque with a maxlen) the census saw holding at least half of "
            "the rise: no leak while the rise stays within its cap", since=CENSUS,
        ),
        nullable(
            "bounded_cap_bytes", "int", "what that holder holds at its cap (its bytes per item x cap)", since=CENSUS
        ),
    ),
    since=LATER,
)
CENSUS_MODULE = Table(
    "CensusModule",
    "Parameter bytes of one top-level module on the device.",
    (
        req("module", "str", "Model.child"),
        req("bytes", "int", "its parameters' storages on the device"),
        req("trained", "bool", "an optimizer holds at least one of them"),
    ),
    since=CENSUS,
)
CENSUS_PROCESS = Table(
    "CensusProcess",
    "Another compute process on the device, as NVML lists it.",
    (
        req("pid", "int", "its PID (NVML's, the host's where the namespaces differ)"),
        req("bytes", "int", "its used GPU memory (-1: withheld)"),
        opt("name", "str", "/proc/<pid>/comm", default=""),
    ),
    since=CENSUS,
)
CENSUS_PROCESSES = Table(
    "CensusProcesses",
    "The device's other compute processes by the process tree.",
    (
        req("split", "bool", "false: NVML's PIDs are not this namespace's (or no list), nothing was split"),
        opt("children", "list", "this process's descendants (DataLoader workers, helpers)", table=CENSUS_PROCESS),
        opt("siblings", "list", "its parent's other descendants (the launcher's other ranks)", table=CENSUS_PROCESS),
        opt("others", "list", "other tenants", table=CENSUS_PROCESS),
    ),
    since=CENSUS,
)
CENSUS_TABLE = Table(
    "Census",
    "What holds the device's bytes at the OOM, read from the job's objects (bounded; cut_short says why not whole).",
    (
        req("complete", "bool", "the walk finished within its budget"),
        nullable("cut_short", "str", "time or objects: the budget that cut it short; failed: it raised"),
        req("seconds", "number", "what it took, in the failing thread"),
        opt("objects", "int", "garbage-collected objects walked", default=0),
        opt(
            "graph_tensors", "int", "tensors on the device with an autograd graph, outside the model states", default=0
        ),
        opt("graph_bytes", "int", "their storages' bytes", default=0),
        opt("detached_tensors", "int", "tensors on the device without a graph, outside the model states", default=0),
        opt("detached_bytes", "int", "their storages' bytes", default=0),
        opt("in_flight_tensors", "int", "of those, held by running frames as plain locals", default=0),
        opt("in_flight_bytes", "int", "their bytes", default=0),
        opt("holders", "list", "what holds the rest, the largest first, at most 8", table=CENSUS_HOLDER),
        opt("modules", "list", "parameters by top-level module, the largest first, at most 8", table=CENSUS_MODULE),
        nullable("processes", "object", "the device's other compute processes", table=CENSUS_PROCESSES),
    ),
    since=CENSUS,
)
JOB = Table(
    "JobSetup",
    "How the job is set up, as far as the hook can tell (null: unknown).",
    (
        nullable("autocast", "bool", "steps run under torch.autocast"),
        nullable("param_dtype", "str", 'the parameters\' dtype, e.g. "torch.bfloat16"'),
        nullable("checkpointing", "bool", "activation checkpointing is in use"),
        nullable("accumulation_steps", "int", "backward passes per optimizer step"),
        nullable("compiled", "bool", "the model runs under torch.compile"),
        nullable("set_to_none", "bool", "zero_grad(set_to_none=True)"),
        nullable("expandable_segments", "bool", "the allocator uses expandable segments"),
        opt("optimizers", "list", "class names of the optimizers", items="str"),
        nullable("activation_offload", "bool", "saved activations go to the CPU (save_on_cpu)", since=LAYOUT),
        nullable("parallelism", "object", "the parallelism in use", table=PARALLELISM, since=LAYOUT),
        nullable("adapters", "bool", "adapter layers (LoRA) train on a frozen base", since=LAYOUT),
    ),
    since=STEP_MEMORY,
)
SNAPSHOT = Table(
    "Snapshot",
    "One process's state, rewritten every publish (snapshots/<process id>.json).",
    (
        req("schema_version", "int", "1"),
        req("kind", "str", '"snapshot"', choices=("snapshot",)),
        req("process", "object", "who wrote it", table=PROCESS),
        req("time", "time", "Unix time of this snapshot"),
        req("seq", "int", "increases with every snapshot of the process"),
        req("state", "str", "exited: the last snapshot of the process", choices=("running", "exited")),
        nullable("exit_reason", "str", "normal, exception, oom, stopped", label=True),
        req("devices", "list", "one object per CUDA device the process uses", table=DEVICE),
        req("steps", "object", "optimizer steps", table=STEPS),
        opt(
            "sources", "map", "allocator, nvml, oom_observer, step_hook, history, profiler -> works", items="bool",
            label=True,
        ),
        opt("errors", "map", "component -> count of swallowed errors", items="int", counter=True, label=True),
        opt("oom_events_unwritten", "int", "OOMs beyond the event-file limit", default=0, counter=True),
        nullable("leak", "object", "the last leak scan's finding", table=LEAK, since=LATER),
        nullable("batch_advice", "object", "the last batch-size advice", table=BATCH_ADVICE, since=LATER),
        nullable("profiling", "str", "id of the profile request running now", since=LATER),
        nullable("job", "object", "how the job is set up", table=JOB, since=STEP_MEMORY),
    ),
    kind="snapshot",
)
PROFILE_OP = Table(
    "ProfileOp",
    "One operator row of a profiling window.",
    (
        req("op", "str", 'operator name ("other" sums the rest)', label=True),
        req("calls", "int", "calls in the window"),
        req("self_cuda_memory_bytes", "int", "memory the op itself allocated on the device (negative: frees)"),
        req("self_cuda_time_us", "number", "self CUDA time, microseconds"),
        req("cuda_time_us", "number", "CUDA time including children, microseconds"),
        req("cpu_time_us", "number", "CPU time, microseconds"),
    ),
    since=LATER,
)
PROFILE = Table(
    "Profile",
    "One on-demand torch.profiler window of N optimizer steps in one process.",
    (
        req("schema_version", "int", "1"),
        req("kind", "str", '"profile"', choices=("profile",)),
        req("process", "object", "who wrote it", table=PROCESS),
        req("request_id", "str", "the request it answers (scheduled-<unix s> for a scheduled window)"),
        req("start_step", "int", "profiling began after this optimizer step (the same on every rank)"),
        req("steps", "int", "the window's length in steps"),
        req("started_at", "time", "when the window began"),
        req("ended_at", "time", "when the window ended"),
        req("device", "int", "the device"),
        req("peak_allocated_bytes", "int", "peak allocated bytes inside the window (from the sampler)"),
        req("top_by_memory", "list", 'top ops by self CUDA memory, then "other"', table=PROFILE_OP),
        req("top_by_time", "list", "top ops by self CUDA time; empty for a memory-only window", table=PROFILE_OP),
        opt("cuda_time", "bool", "false: a memory-only window, CUDA time not traced", default=True),
        nullable("table_artifact", "str", "the profiler's key_averages() table, in artifacts/"),
        nullable("trace_artifact", "str", "the gzipped Chrome trace, in artifacts/"),
    ),
    since=LATER,
    kind="profile",
)
DIAGNOSIS = Table(
    "Diagnosis",
    "Why the OOM happened (docs/diagnosis.md).",
    (
        req("cause", "str", "the diagnosed cause", label=True),
        req("summary", "str", "one sentence"),
        req("remedies", "list", "what to try, best first", items="str"),
        opt("facts", "map", "the numbers the diagnosis used", items="any"),
    ),
)
MODEL_STATES = Table(
    "ModelStates",
    "Memory of the model's states at the OOM, from the optimizers (or, with none, the live parameters).",
    (
        opt("parameters_bytes", "int", "parameters", default=0),
        opt("gradients_bytes", "int", "gradients", default=0),
        opt("optimizer_state_bytes", "int", "optimizer state held now", default=0),
        nullable("optimizer_state_expected_bytes", "int", "optimizer state once initialised (null: unknown)"),
        nullable(
            "optimizers", "int", "optimizers found (0: none, the parameters were found as live tensors); null: unknown",
            since=AT_OOM,
        ),
        nullable("param_dtype", "str", 'the dtype holding most parameter bytes, e.g. "bfloat16"', since=AT_OOM),
        *STATES_LAYOUT,
    ),
    since=STEP_MEMORY,
)
OOM_EVENT = Table(
    "OomEvent",
    "One CUDA OOM (events/<process id>.oom-<seq:05d>.json), rewritten once its outcome is known.",
    (
        req("schema_version", "int", "1"),
        req("kind", "str", '"oom_event"', choices=("oom_event",)),
        req("process", "object", "who wrote it", table=PROCESS),
        req("seq", "int", "1, 2, ... per process"),
        req("time", "time", "Unix time of the OOM"),
        req("device", "int", "the failing device"),
        req("gpu_uuid", "str", "its UUID", label=True),
        req("requested_bytes", "int", "size of the failing allocation (after the allocator's rounding)"),
        req("device_free_bytes", "int", "what the process could still get, as the allocator's observer saw it"),
        req("device_total_bytes", "int", "the device total (the cap under set_per_process_memory_fraction)"),
        req("allocated_bytes", "int", "allocator state at the OOM"),
        req("reserved_bytes", "int", "allocator state at the OOM"),
        opt("inactive_split_bytes", "int", "allocator state at the OOM", default=0),
        opt("reserved_unallocated_bytes", "int", "reserved minus allocated at the OOM", default=0),
        opt("step", "int", "optimizer steps completed before the OOM", default=0),
        nullable("nvml", "object", "as in the snapshot, at the OOM", table=NVML),
        nullable("categories", "object", "as in the snapshot, at the OOM", table=CATEGORIES),
        opt("allocator_summary", "str", "torch.cuda.memory_summary(abbreviated=True), at most 8 KiB", default=""),
        opt("stack", "list", 'the Python stack of the failing allocation, "file:line in function"', items="str"),
        req("diagnosis", "object", "cause, summary, remedies, facts", table=DIAGNOSIS),
        nullable("snapshot_artifact", "str", "file name in artifacts/ of the memory snapshot pickle"),
        req("outcome", "str", "pending of a process that is gone reads as fatal", choices=OUTCOME_CHOICES),
        nullable("outcome_time", "time", "when the outcome was decided"),
        opt("steps_memory", "list", STEPS_MEMORY_DOC, items="row", since=STEP_MEMORY),
        nullable("phase", "str", '"forward", "backward", "optimizer" or "unknown"', since=STEP_MEMORY),
        nullable("largest_free_block_bytes", "int", "the largest free block of the allocator", since=STEP_MEMORY),
        nullable("job", "object", "how the job is set up", table=JOB, since=STEP_MEMORY),
        nullable("model_states", "object", "model states at the OOM", table=MODEL_STATES, since=STEP_MEMORY),
        nullable("physical_free_bytes", "int", "free on the device before any per-process cap", since=STEP_MEMORY),
        nullable("limit_bytes", "int", "cap of set_per_process_memory_fraction; null if unset", since=STEP_MEMORY),
        nullable(
            "grad_enabled", "bool", "autograd was recording in the failing thread (false: no_grad, inference_mode)",
            since=AT_OOM,
        ),
        opt(
            "sampled_allocated",
            "list",
            "the sampler's last readings, oldest first: [time, allocated_bytes] and, since 1.5, "
            "peak_allocated_bytes and allocated_total_bytes",
            items="row", since=AT_OOM,
        ),
        nullable("last_step_time", "time", "Unix time the last optimizer step completed", since=AT_OOM),
        nullable("module_training", "bool", "the outermost nn.Module trains (false: eval)", since=JUDGED),
        nullable(
            "module_frozen", "bool", "the outermost nn.Module on the failing stack has no trainable parameter",
            since=LAYOUT,
        ),
        nullable(
            "private_pool_bytes", "int", "reserved bytes in private pools (CUDA graphs, MemPool) at the OOM",
            since=LAYOUT,
        ),
        nullable("private_pool_free_bytes", "int", "of those, bytes not allocated", since=LAYOUT),
        opt(
            "captured_by", "str", "observer (the allocator's OOM observer) or exception (the OutOfMemoryError)",
            default="observer", since=LAYOUT, choices=("observer", "exception"),
        ),
        opt(
            "forwards_memory",
            "list",
            "after forwards of the outermost model that recorded an autograd graph, with no optimizer step "
            "since they began (none yet, or a training job's pause), oldest first, at most 128: rows "
            "[forward, time, allocated_bytes, peak_bytes, start_bytes] (peak -1: the forward set no new lifetime "
            "peak; start: allocated as the forward began, -1 or absent: not read)",
            items="row", since=FORWARDS,
        ),
        nullable(
            "forwards_since_backward", "int",
            "forwards of the outermost model that recorded a graph since a backward last consumed one",
            since=CONSUMED,
        ),
        nullable(
            "most_forwards_per_backward", "int",
            "the most forwards whose graphs one backward consumed together (null: no backward ran through the model)",
            since=CONSUMED,
        ),
        opt(
            "input_elements", "int",
            "the most elements one forward of the outermost model took in since the last step row: the failing "
            "step's forwards so far (-1: none seen)",
            default=-1, since=OBSERVED,
        ),
        opt(
            "backwards_memory",
            "list",
            "after each backward through the outermost model since the last optimizer step (an accumulation "
            "window), oldest first, at most 64: rows [backward, time, allocated_bytes] (backward: its number in "
            "the process)",
            items="row", since=OBSERVED,
        ),
        nullable(
            "least_forwards_per_backward", "int",
            "the fewest forwards whose graphs one backward consumed together (equal to the most: fixed windows)",
            since=CENSUS,
        ),
        nullable(
            "census", "object", "what holds the device's bytes at the OOM (null: not taken)", table=CENSUS_TABLE,
            since=CENSUS,
        ),
    ),
    kind="oom_event",
)

PROFILE_REQUEST = Table(
    "ProfileRequestDocument",
    "A request for a profiling window (requests/profile-<id>.json), by the admin endpoint or oomsight profile.",
    (
        opt("schema_version", "int", "1", default=1),
        req("kind", "str", '"profile_request"', choices=("profile_request",)),
        req("id", "str", "letters, digits and -"),
        req("steps", "int", "the window's length in optimizer steps, 1 to 100"),
        opt("start_step", "int", "start after this optimizer step (or at once when already past it)", default=0),
        req("created_at", "time", "when it was written; a process handles requests created after it started"),
        opt("cuda_time", "bool", "false asks for a memory-only window", default=True),
    ),
    since=LATER,
    kind="profile_request",
)

DOCUMENTS: dict[str, Table] = {t.kind: t for t in (SNAPSHOT, OOM_EVENT, PROFILE, PROFILE_REQUEST) if t.kind}
"""Top-level tables by ``kind``."""


def tables() -> list[Table]:
    """Every table, nested ones first, each once."""
    out: list[Table] = []

    def visit(t: Table) -> None:
        for f in t.fields:
            if f.table is not None:
                visit(f.table)
        if t not in out:
            out.append(t)

    for t in DOCUMENTS.values():
        visit(t)
    return out


PREDICTED_PEAK_ANNOTATION = "oomsight.io/predicted-peak-bytes"
"""Pod annotation ``oomsight predict --annotate`` writes: the predicted peak allocated
bytes, as a decimal integer string (annotation values are strings)."""

PREDICTED_PEAK_RESERVED_ANNOTATION = "oomsight.io/predicted-peak-reserved-bytes"
"""Pod annotation beside ``PREDICTED_PEAK_ANNOTATION``: the predicted peak reserved bytes
(what the caching allocator holds from the driver), when the prediction gives it."""
