"""The settings tables: every ``OOMSIGHT_*`` variable of the training process (:data:`HOOK`) and
of the sidecar (:data:`SIDECAR`) and of the webhook's server (:data:`WEBHOOK`), one row each.

Each row (:class:`~oomsight.config.table.Setting`) names a setting once: its ``oomsight.start()``
keyword (the variable is ``OOMSIGHT_`` + the keyword in capitals, except ``OOMSIGHT_DIR``, a name
users set before the rule), the group and field that hold it, its default, its parser and its
meaning. ``python -m oomsight.config.rendering`` generates from these tables the dataclasses of
:mod:`oomsight.config.hook` (one frozen group per component, a docstring per field), those of
:mod:`oomsight.config.sidecar` and :mod:`oomsight.config.webhook` (the fields of their groups,
which ``oomsight_sidecar.settings`` and ``oomsight_webhook.settings`` extend with how they are
read and checked) and the tables in ``docs/configuration.md``; ``--check`` fails when one has
drifted. The sidecar's and webhook's rows have no ``start()`` keyword: theirs only names the
variable (and a flag may override it).

Adding a setting: add a row here (and a group if it starts one), run the generator, and read
the field where the component uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Protocol

from oomsight.config.table import Group, Setting, Value
from oomsight.config.values import DEFAULT_METRICS_PORT, ConfigError, parse_bool, parse_count, parse_port, parse_seconds

HISTORY_MODES = ("all", "state")


def default_spool_dir() -> str:
    """Where the hook writes when ``OOMSIGHT_DIR`` is unset: ``$TMPDIR/oomsight``, else ``/tmp/oomsight``.

    Named, not probed: ``tempfile.gettempdir()`` raises where no temporary folder is writable
    (a read-only root filesystem with only the spool mounted, as the injected sidecar runs),
    and this default is computed even when ``OOMSIGHT_DIR`` is set."""
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", "oomsight")


def parse_choice(choices: tuple[str, ...], name: str, raw: str) -> str:
    """One of ``choices``, as written."""
    if raw not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _seconds_or_off(name: str, raw: str) -> float:
    return 0.0 if raw in ("0", "0.0", "") else parse_seconds(name, raw)


def _verbatim(_name: str, raw: str) -> str:
    return raw


def _spool_dir(_name: str, raw: str) -> str:
    return raw or default_spool_dir()


GROUPS = (
    Group("spool", "SpoolSettings", "Where the hook writes: the spool writer and the profiler's request folder."),
    Group("sampling", "SamplingSettings", "The sampler thread: how often it reads the allocator and publishes."),
    Group("nvml", "NvmlSettings", "NVML: read by the runtime, which gives the sampler an NVML reader or none."),
    Group("steps", "StepSettings", "The global optimizer step hook (the step tracker)."),
    Group("oom", "OomSettings", "OOM capture (the OOM recorder): the observer, the event files and what they leave."),
    Group("history", "HistorySettings", "Allocation history, started by the runtime when CUDA initialises."),
    Group("profiler", "ProfilerSettings", "Scheduled profiling windows (the profiler); on-demand ones need none."),
    Group("prediction", "PredictionSettings", "The job's predicted peak, published next to the measured one."),
)
"""The groups of :class:`~oomsight.config.hook.Settings`, in its order."""

HOOK = (
    Setting(
        "spool_dir",
        "spool",
        "dir",
        default_spool_dir,
        _spool_dir,
        env="OOMSIGHT_DIR",
        verbatim=True,
        shown="`$TMPDIR/oomsight` (`/tmp/oomsight` without `TMPDIR`)",
        meaning="spool directory shared with the sidecar (`emptyDir` in a pod; a temporary folder under "
        "`oomsight run`)",
    ),
    Setting("disabled", "", "disabled", False, parse_bool, "`1` turns the hook off entirely (one log line, no more)"),
    Setting(
        "sample_interval_seconds",
        "sampling",
        "interval_seconds",
        0.1,
        parse_seconds,
        "how often the sampler thread reads the allocator counters (≈20 µs per device)",
    ),
    Setting(
        "publish_interval_seconds",
        "sampling",
        "publish_interval_seconds",
        1.0,
        parse_seconds,
        "how often the process snapshot is rewritten in the spool (and NVML queried); at least the sample interval",
    ),
    Setting(
        "window_seconds",
        "sampling",
        "window_seconds",
        60.0,
        parse_seconds,
        "sliding window of the exported window peak/minimum; keep it ≥ the scrape interval (and ≥ the publish "
        "interval). The leak trend takes a point every window/6",
    ),
    Setting("nvml", "nvml", "enabled", True, parse_bool, "query NVML for the devices the process uses"),
    Setting(
        "step_hook",
        "steps",
        "hook",
        True,
        parse_bool,
        "register the global optimizer step hooks (steps, step time, memory by category), and before the first "
        "step a forward hook on the outermost model (forward rows). Off: no step or forward rows, "
        "job setup, leak scan or scheduled profiling windows",
    ),
    Setting(
        "step_peaks",
        "steps",
        "peaks",
        False,
        parse_bool,
        "**opt-in**: read and reset the allocator peak after each optimizer step. This calls "
        "`torch.cuda.reset_peak_memory_stats()`, which also resets what `torch.cuda.max_memory_allocated()` "
        "returns to your code, Lightning or torchtune",
    ),
    Setting(
        "categories_interval_seconds",
        "steps",
        "categories_interval_seconds",
        30.0,
        parse_seconds,
        "minimum time between two walks of the optimizers' tensors (parameters, gradients, optimizer state), "
        "made in the training thread right after a step",
    ),
    Setting(
        "oom_observer",
        "oom",
        "observer",
        True,
        parse_bool,
        "attach the allocator's OOM observer (private API `torch._C._cuda_attach_out_of_memory_observer`, "
        "feature-detected) to record every OOM durably",
    ),
    Setting(
        "record_history",
        "history",
        "record",
        False,
        parse_bool,
        "record allocation history with Python stacks (bounded ring) so an OOM writes a snapshot pickle for "
        "https://pytorch.org/memory_viz (about 2 µs an allocation). Skipped when you already record history yourself",
    ),
    Setting(
        "history_max_entries",
        "history",
        "max_entries",
        10_000,
        parse_count,
        "ring size of that history (each entry is a few KB of host memory)",
    ),
    Setting(
        "history_mode",
        "history",
        "mode",
        "all",
        functools.partial(parse_choice, HISTORY_MODES),
        "`all`: alloc/free events with the allocating Python stack (memory_viz's timeline); `state`: only the "
        "stacks of live blocks — who holds memory at the OOM — at lower cost (`benchmarks/results/`)",
    ),
    Setting(
        "profile_every_seconds",
        "profiler",
        "every_seconds",
        0.0,
        _seconds_or_off,
        "scheduled profiling: every this many seconds, profile `OOMSIGHT_PROFILE_STEPS` optimizer steps with "
        "`torch.profiler`; `0`: off (on-demand profiling works without it: `oomsight profile`, or the sidecar's "
        "admin endpoint)",
    ),
    Setting("profile_steps", "profiler", "steps", 5, parse_count, "steps in a scheduled profiling window"),
    Setting(
        "profile_scheduled_cuda_time",
        "profiler",
        "scheduled_cuda_time",
        False,
        parse_bool,
        "scheduled windows trace CUDA time too. Off, they are memory-only: the top operators by self CUDA "
        "memory, no CUDA time, CUPTI never attached and no slowdown after the window (below)",
    ),
    Setting(
        "artifacts_max_bytes",
        "oom",
        "artifacts_max_bytes",
        256 * 1024 * 1024,
        parse_count,
        "size bound of the spool's `artifacts/` folder; oldest artifacts are evicted first (before an OOM writes "
        "its memory-snapshot pickle, down to half of it). Lowered to half the spool's filesystem, and set by the "
        "webhook to half the spool's `sizeLimit` (`docs/spool-format.md`, writing rules)",
    ),
    Setting(
        "max_oom_events",
        "oom",
        "max_events",
        1000,
        parse_count,
        "per process, OOM event files written at most; later OOMs are counted (`oomsight_oom_events_unwritten_total`)",
    ),
    Setting(
        "termination_message_path",
        "oom",
        "termination_message_path",
        "/dev/termination-log",
        _verbatim,
        "where a fatal OOM's diagnosis is written so `kubectl describe pod` shows it — only if the file already "
        "exists (Kubernetes creates it); empty: never",
        verbatim=True,
    ),
    Setting(
        "prediction",
        "prediction",
        "source",
        "",
        _verbatim,
        verbatim=True,
        shown="empty (none)",
        meaning="the job's predicted peak, published next to the measured one "
        "(`oomsight_predicted_peak_allocated_bytes`, the report, the pod dashboard): the path of the JSON that "
        "`oomsight predict --json` wrote, or a size such as `30GiB` (peak allocated bytes). Read when the hook "
        "starts; a value that cannot be used is one warning and "
        '`oomsight_hook_errors_total{component="prediction"}`, never a reason for the hook to stay off. '
        "From code: `oomsight.record_prediction(...)` (`docs/prediction.md`)",
    ),
)
"""Every setting of the hook, in the order of ``docs/configuration.md``."""

BY_KEYWORD = {row.keyword: row for row in HOOK}

DEFAULT_ADMIN_PORT = 21401
ADMIN_PORT_AUTO = "auto"
_YEAR = 365 * 86_400.0
_long_seconds = functools.partial(parse_seconds, minimum=0.0, maximum=_YEAR)


def parse_admin_port(name: str, raw: str) -> int | None:
    """A port for the admin endpoint: 0 (off), 1-65535, or ``auto`` (None: the system picks)."""
    return None if raw.strip().lower() == ADMIN_PORT_AUTO else parse_port(name, raw)


def _limits(
    component: str, connections: int, idle: float, request: float, meanings: tuple[str, ...]
) -> tuple[Setting, ...]:
    """The five limits of one component's HTTP servers (``oomsight_server.listener.ServerLimits``):
    group ``limits``, variables ``OOMSIGHT_<COMPONENT>_MAX_CONNECTIONS`` and so on."""
    hour = functools.partial(parse_seconds, minimum=0.1, maximum=3600.0)
    rows: tuple[tuple[str, Value, Callable[[str, str], Value]], ...] = (
        ("max_connections", connections, functools.partial(parse_count, maximum=10_000)),
        ("workers", 4, functools.partial(parse_count, maximum=64)),
        ("idle_timeout_seconds", idle, hour),
        ("request_timeout_seconds", request, hour),
        ("max_head_bytes", 8 * 1024, functools.partial(parse_count, minimum=1024)),
    )
    return tuple(
        Setting(f"{component}_{field}", "limits", field, default, parse, meaning)
        for (field, default, parse), meaning in zip(rows, meanings)
    )


SIDECAR_GROUPS = (
    Group("sidecar", "SidecarFields", "The metrics server and what it reads."),
    Group("admin", "AdminFields", "The admin endpoint (profiling requests, artifact downloads)."),
    Group("pod", "KubernetesFields", "The pod the sidecar runs in, as the webhook tells it (downward API, admission)."),
)
"""The groups of the sidecar's settings (``oomsight_sidecar.settings``), in the documentation's order."""

_SPOOL = dataclasses.replace(
    BY_KEYWORD["spool_dir"], group="sidecar", field="spool_dir", flag="--spool", meaning="spool directory to serve"
)
SIDECAR = (
    _SPOOL,
    Setting(
        "sidecar_port",
        "sidecar",
        "port",
        DEFAULT_METRICS_PORT,
        parse_port,
        flag="--port",
        meaning="metrics port, outside the crowded 9100-9999 exporter range (9400 is dcgm-exporter's)",
    ),
    Setting(
        "sidecar_host",
        "sidecar",
        "host",
        "127.0.0.1",
        _verbatim,
        "listen address: this machine only when run by "
        "hand; the webhook gives the injected sidecar `0.0.0.0`, so Prometheus reaches the pod IP (`::` for IPv6)",
        flag="--host",
        shown="`127.0.0.1` (injected sidecars: `0.0.0.0`)",
    ),
    Setting(
        "retention_seconds",
        "sidecar",
        "retention_seconds",
        300.0,
        _long_seconds,
        flag="--retention-seconds",
        meaning="an exited process's series stay this long",
    ),
    Setting(
        "stale_after_seconds",
        "sidecar",
        "stale_after_seconds",
        30.0,
        _long_seconds,
        flag="--stale-after-seconds",
        meaning="a process silent for this long counts as gone",
    ),
    Setting(
        "drain_seconds",
        "sidecar",
        "drain_seconds",
        0.0,
        _long_seconds,
        flag="--drain-seconds",
        meaning="after SIGTERM, keep serving this long for a last scrape",
    ),
    Setting(
        "sidecar_hung_after_seconds",
        "sidecar",
        "hung_after_seconds",
        20.0,
        parse_seconds,
        "a collect running longer than this makes `/readyz` 503 and `/healthz` 500 (the kubelet restarts a sidecar "
        "stuck on a hung filesystem); `/readyz` is also 503 while the last collect raised",
    ),
    Setting(
        "admin_host",
        "admin",
        "host",
        "127.0.0.1",
        _verbatim,
        "admin endpoint address (`POST /admin/profile?steps=N` and `&memory_only=1`, `GET /admin/profiles`, "
        "`GET /admin/artifacts/<name>`); reach it with `kubectl port-forward`. Any non-loopback address requires a "
        "token",
    ),
    Setting(
        "admin_port",
        "admin",
        "port",
        DEFAULT_ADMIN_PORT,
        parse_admin_port,
        kind="Optional[int]",
        meaning="admin port; `0` turns the endpoint off; `auto` lets the system pick a free port (logged at start). "
        "A port already taken turns the endpoint off with a warning; the metrics go on",
    ),
    Setting(
        "admin_token",
        "admin",
        "token",
        None,
        _verbatim,
        verbatim=True,
        kind="Optional[str]",
        shown="unset",
        meaning="bearer token every admin request must carry (`Authorization: Bearer …`)",
    ),
    Setting(
        "admin_token_file",
        "admin",
        "token_file",
        "",
        _verbatim,
        shown="unset",
        meaning="the file the token is read from when `OOMSIGHT_ADMIN_TOKEN` is unset; with "
        "`OOMSIGHT_ADMIN_REQUIRE_TOKEN` and no file there, one is made (mode 0600)",
    ),
    Setting(
        "admin_require_token",
        "admin",
        "require_token",
        False,
        parse_bool,
        "require a token even on loopback; with no token, one is made and written to `OOMSIGHT_ADMIN_TOKEN_FILE` "
        "(mode 0600). The webhook sets it, with `OOMSIGHT_ADMIN_PORT=auto`, in `hostNetwork` pods, whose loopback "
        "is the node's",
    ),
    Setting(
        "pod_name",
        "pod",
        "pod_name",
        "",
        _verbatim,
        "the pod's name (downward API); empty outside Kubernetes",
        verbatim=True,
    ),
    Setting(
        "pod_namespace", "pod", "pod_namespace", "", _verbatim, "the pod's namespace (downward API)", verbatim=True
    ),
    Setting(
        "pod_uid",
        "pod",
        "pod_uid",
        "",
        _verbatim,
        verbatim=True,
        meaning="the pod's uid (downward API): Events name the pod by it; name, namespace and uid are all needed to "
        "post Events",
    ),
    Setting(
        "owner_kind",
        "pod",
        "owner_kind",
        "",
        _verbatim,
        verbatim=True,
        meaning="the kind of the pod's controller (`Job`, `PyTorchJob`, ...), read by the webhook from "
        "`ownerReferences`",
    ),
    Setting(
        "owner_name",
        "pod",
        "owner_name",
        "",
        _verbatim,
        verbatim=True,
        meaning="the name of the pod's controller; with its kind, published as `oomsight_pod_owner_info`",
    ),
    Setting(
        "events",
        "pod",
        "events",
        True,
        parse_bool,
        "post an `events.k8s.io/v1` Event for each new OOM (needs the chart's RBAC grant; annotation "
        '`oomsight.io/events: "false"` turns it off per pod)',
    ),
    Setting(
        "events_interval_seconds",
        "pod",
        "events_interval_seconds",
        2.0,
        parse_seconds,
        "how often the spool is checked for new OOM events (and once more at SIGTERM)",
    ),
    Setting(
        "events_max",
        "pod",
        "events_max",
        100,
        functools.partial(parse_count, minimum=0),
        "Events per pod at most; later OOMs are counted as `suppressed`, not posted",
    ),
    Setting(
        "resource_claims",
        "pod",
        "resource_claims",
        False,
        parse_bool,
        "read the GPU memory budget of the pod's DRA ResourceClaims (`oomsight_gpu_memory_budget_bytes`; needs "
        "the chart's `rbac.resourceClaims` grant to list ResourceClaims in the pod's namespace)",
    ),
    *_limits(
        "sidecar",
        1024,
        15.0,
        30.0,
        (
            "connections held open by each of the metrics and admin servers; over it the one that has waited longest "
            "for its request is closed (never the newcomer); a waiting connection costs a descriptor, not a thread",
            "requests answered at once by each server (threads); a request waits, whole, for a free one",
            "a connection silent this long is closed",
            "a request (head and body) not received within this is cut off (trickling clients); answers are not "
            "limited by it",
            "request line plus headers at most; larger requests get `431` and a close",
        ),
    ),
)
"""Every variable of the sidecar, in the order of ``docs/configuration.md``; its servers' limits
(group ``limits``) are read into ``oomsight_server.listener.ServerLimits``."""

MIB = 1024 * 1024
_bytes = functools.partial(parse_count, minimum=1024, maximum=64 * MIB)

WEBHOOK_GROUPS = (
    Group("webhook", "WebhookFields", "The admission webhook's server and TLS; the chart sets them (its deployment)."),
)
"""The group of the webhook's settings (``oomsight_webhook.settings``)."""

WEBHOOK = (
    Setting(
        "webhook_host",
        "webhook",
        "host",
        "0.0.0.0",
        _verbatim,
        flag="--host",
        meaning="listen address of the HTTPS and metrics ports (`::` for IPv6 and dual-stack; chart: "
        "`webhook.listenAddress`)",
    ),
    Setting(
        "webhook_port",
        "webhook",
        "port",
        21443,
        parse_port,
        flag="--port",
        meaning="HTTPS port (`POST /mutate`, `GET /healthz`) the Service's port 443 forwards to",
    ),
    Setting(
        "webhook_metrics_port",
        "webhook",
        "metrics_port",
        21401,
        parse_port,
        "plain-HTTP `/metrics` of the webhook itself; `0` turns it off",
    ),
    Setting(
        "webhook_tls_mode",
        "webhook",
        "tls_mode",
        "self",
        _verbatim,
        flag="--tls-mode",
        meaning="`self`: keep a CA and certificate in a Secret and patch `caBundle`; `files`: read "
        "`OOMSIGHT_WEBHOOK_CERT_FILE`/`_KEY_FILE` (cert-manager mounts them) and reload them when they change",
    ),
    Setting(
        "webhook_cert_file",
        "webhook",
        "cert_file",
        "/etc/oomsight/tls/tls.crt",
        _verbatim,
        "serving certificate (PEM) in `files` mode",
        verbatim=True,
    ),
    Setting(
        "webhook_key_file",
        "webhook",
        "key_file",
        "/etc/oomsight/tls/tls.key",
        _verbatim,
        "its private key (PEM) in `files` mode",
        verbatim=True,
    ),
    Setting(
        "webhook_cert_dir",
        "webhook",
        "cert_dir",
        "/tmp/oomsight-webhook",
        _verbatim,
        verbatim=True,
        meaning="where `self` mode writes the current certificate for the TLS library (an `emptyDir`)",
    ),
    Setting(
        "webhook_namespace",
        "webhook",
        "namespace",
        "",
        _verbatim,
        verbatim=True,
        meaning="the webhook's namespace (downward API): where its Secret lives, part of its DNS name",
    ),
    Setting(
        "webhook_service",
        "webhook",
        "service",
        "",
        _verbatim,
        verbatim=True,
        meaning="the webhook's Service: the certificate is made for `<service>.<namespace>.svc`",
    ),
    Setting(
        "webhook_secret",
        "webhook",
        "secret",
        "",
        _verbatim,
        verbatim=True,
        meaning="`self` mode: the Secret that holds the CA and the serving certificate",
    ),
    Setting(
        "webhook_configuration",
        "webhook",
        "configuration",
        "",
        _verbatim,
        verbatim=True,
        meaning="`self` mode: the MutatingWebhookConfiguration whose `caBundle` it keeps",
    ),
    Setting(
        "webhook_tls_reconcile_seconds",
        "webhook",
        "tls_reconcile_seconds",
        60.0,
        parse_seconds,
        "how often `self` mode re-checks the Secret (renewal) and `caBundle` (restored after an upgrade)",
    ),
    Setting(
        "webhook_max_body_bytes",
        "webhook",
        "max_body_bytes",
        4 * MIB,
        _bytes,
        "larger requests are refused (413) unread (the API server keeps objects under 3 MiB, so a real review is "
        "never this large)",
    ),
    Setting(
        "webhook_max_review_bytes",
        "webhook",
        "max_review_bytes",
        1 * MIB,
        _bytes,
        "a larger review is not parsed: it is read through in 64 KiB chunks keeping only its head, and answered "
        "`allowed` without the sidecar, with a warning (fail-open, "
        '`oomsight_webhook_admissions_total{result="skipped"}`)',
    ),
    Setting(
        "webhook_max_containers",
        "webhook",
        "max_containers",
        500,
        parse_count,
        "a pod with more containers plus init containers is admitted unchanged with a warning (`skipped`)",
    ),
    Setting(
        "webhook_max_concurrent_reviews",
        "webhook",
        "max_concurrent_reviews",
        2,
        functools.partial(parse_count, maximum=64),
        "reviews parsed and mutated at once (parsing holds the GIL: more buys memory, not speed); one that waits "
        "longer than half the request timeout is admitted unchanged (`skipped`)",
    ),
    *_limits(
        "webhook",
        256,
        30.0,
        10.0,
        (
            "HTTPS connections held open (and, separately, on the metrics port); over it the one that has waited "
            "longest for its request is closed, never the newcomer",
            "requests answered at once (bodies read, then a turn to parse); with the review limits this bounds the "
            "webhook's memory",
            "a kept-alive connection silent this long is closed",
            "read deadline of one request, TLS handshake, head and body (the API server's own webhook timeout is "
            "10 s by default)",
            "request line plus headers at most",
        ),
    ),
)
"""Every variable of the webhook's server, in the order of ``docs/configuration.md``; its servers'
limits (group ``limits``) are read into ``oomsight_server.listener.ServerLimits``."""

NATIVE_MODES = ("auto", "true", "false")
CONTAINER_MODES = ("gpu", "all")


def _lower_choice(choices: tuple[str, ...], name: str, raw: str) -> str:
    return parse_choice(choices, name, raw.lower())


def _drain_seconds(name: str, raw: str) -> float:
    return parse_seconds(name, raw, minimum=0.0, maximum=3600.0)


_RESOURCE = "a Kubernetes quantity; an empty value leaves it unset"
INJECT = (
    Setting(
        "inject_image",
        "inject",
        "image",
        "",
        _verbatim,
        "the oomsight image of the injected sidecar and zero-code init container (required)",
        shown="required",
    ),
    Setting(
        "inject_image_pull_policy",
        "inject",
        "image_pull_policy",
        "IfNotPresent",
        _verbatim,
        "pull policy of the injected containers",
    ),
    Setting(
        "inject_native_sidecar",
        "inject",
        "native_sidecar",
        "auto",
        functools.partial(_lower_choice, NATIVE_MODES),
        "`true`: inject a native sidecar (an init container with `restartPolicy: Always`, Kubernetes 1.29+) so "
        "Jobs complete; `false`: a regular container; `auto`: decided once at start from the API server's version",
    ),
    Setting(
        "inject_kube_version_hint",
        "inject",
        "kube_version_hint",
        "",
        _verbatim,
        "the cluster's version as the chart saw it at render time (`auto` uses it when the API server cannot be asked)",
    ),
    Setting(
        "inject_containers",
        "inject",
        "containers",
        "gpu",
        functools.partial(parse_choice, CONTAINER_MODES),
        "which containers get the spool and the env: `gpu` (those asking for a GPU) or `all`",
    ),
    Setting(
        "inject_gpu_resources",
        "inject",
        "gpu_resources",
        "nvidia.com/gpu,nvidia.com/mig-,amd.com/gpu",
        _verbatim,
        "comma-separated resource names (or prefixes) that mean a container asks for a GPU",
    ),
    Setting(
        "inject_spool_size_limit",
        "inject",
        "spool_size_limit",
        "256Mi",
        _verbatim,
        "`sizeLimit` of the memory-backed spool `emptyDir` (it counts as the pod's memory); a Kubernetes quantity",
    ),
    Setting(
        "inject_metrics_port",
        "inject",
        "metrics_port",
        DEFAULT_METRICS_PORT,
        parse_port,
        "the injected sidecar's metrics port (named `metrics`)",
    ),
    Setting(
        "inject_cpu_request",
        "inject",
        "cpu_request",
        "10m",
        _verbatim,
        f"CPU the sidecar requests; {_RESOURCE}",
        empty=True,
    ),
    Setting(
        "inject_memory_request",
        "inject",
        "memory_request",
        "64Mi",
        _verbatim,
        f"memory the sidecar requests; {_RESOURCE}",
        empty=True,
    ),
    Setting(
        "inject_cpu_limit",
        "inject",
        "cpu_limit",
        "",
        _verbatim,
        f"CPU limit of the sidecar (unset by default so scrapes are never throttled); {_RESOURCE}",
        empty=True,
    ),
    Setting(
        "inject_memory_limit",
        "inject",
        "memory_limit",
        "128Mi",
        _verbatim,
        f"memory limit of the sidecar; {_RESOURCE}",
        empty=True,
    ),
    Setting(
        "inject_run_as_user",
        "inject",
        "run_as_user",
        65532,
        parse_count,
        "the fixed non-root UID and GID of the injected containers",
    ),
    Setting(
        "inject_scrape_annotations",
        "inject",
        "scrape_annotations",
        True,
        parse_bool,
        "add `prometheus.io/scrape`, `port` and `path` to the pod (Prometheus without the operator)",
    ),
    Setting(
        "inject_events",
        "inject",
        "events",
        True,
        parse_bool,
        "let the sidecar post Kubernetes Events on OOM (it still needs the RBAC grant); annotation "
        "`oomsight.io/events` per pod",
    ),
    Setting(
        "inject_resource_claims",
        "inject",
        "resource_claims",
        False,
        parse_bool,
        "give the sidecar `OOMSIGHT_RESOURCE_CLAIMS=1` (the chart's `rbac.resourceClaims` grants the read)",
    ),
    Setting(
        "inject_zero_code",
        "inject",
        "zero_code",
        True,
        parse_bool,
        'honour `oomsight.io/inject-python: "true"` (the pod still has to opt in)',
    ),
    Setting(
        "inject_drain_seconds",
        "inject",
        "drain_seconds",
        0.0,
        _drain_seconds,
        "the sidecar's `OOMSIGHT_DRAIN_SECONDS` (0 to 3600): serve this long after SIGTERM for a last scrape",
    ),
    Setting(
        "inject_admin_port",
        "inject",
        "admin_port",
        DEFAULT_ADMIN_PORT,
        parse_admin_port,
        "the sidecar's admin port on its loopback; `0` off, `auto` the system picks; `hostNetwork` pods always "
        'get `auto` and a required token (`docs/kubernetes.md`, "Ports")',
        kind="Optional[int]",
    ),
)
"""What the webhook injects (``oomsight_webhook.injection``), set by the chart from ``values.yaml``;
per-pod overrides are annotations."""

TABLES = {"hook": HOOK, "sidecar": SIDECAR, "webhook": WEBHOOK, "inject": INJECT}
"""Every settings table: together, every ``OOMSIGHT_*`` variable oomsight reads."""


class _Sampled(Protocol):
    """What :func:`check` reads of ``oomsight.config.hook.Settings`` (named by shape, not imported:
    that module imports this one)."""

    @property
    def sampling(self) -> object: ...


def check(settings: _Sampled) -> None:
    """Reject combinations that cannot work, naming the variables involved."""
    sampling = settings.sampling
    for shorter, longer in (
        ("publish_interval_seconds", "sample_interval_seconds"),
        ("window_seconds", "publish_interval_seconds"),
    ):
        value, bound = (getattr(sampling, BY_KEYWORD[k].field) for k in (shorter, longer))
        if value < bound:
            raise ConfigError(
                f"{BY_KEYWORD[shorter].variable}={value:g} is shorter than {BY_KEYWORD[longer].variable}={bound:g}"
            )
