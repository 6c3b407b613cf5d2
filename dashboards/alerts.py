"""Alerting rules: before an OOM (near capacity, forecast, leak, fragmentation, retries), at
it (a CUDA OOM happened), past a pod's DRA memory budget, about oomsight itself (sidecar down,
hook silent or missing, the webhook's certificate, errors and availability) and about waste
(GPU memory badly underused), and a job that outgrew the peak ``oomsight predict`` gave it.

Every name starts with ``Oomsight`` so it cannot collide with another rule set's alerts (dcgm,
kubernetes-mixin). Every alert gets ``runbook_url`` from :func:`add_runbook_links`;
``docs/alerts.md`` explains the thresholds and ``docs/runbooks/<alert>.md`` the remedies.
Thresholds the chart can override are written as :func:`knob.knob` tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dashboards import config as c
from dashboards import rules as r
from dashboards.knob import fill, knob, parts

T = c.THRESHOLDS
WHERE = "{{ $labels.namespace }}/{{ $labels.pod }} rank {{ $labels.rank }} GPU {{ $labels.device }}"


@dataclasses.dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str
    description: str

    def rule(self) -> dict[str, Any]:
        """The rule as the plain rule file has it (thresholds filled in)."""
        return {
            "alert": self.name,
            "expr": fill(self.expr),
            "for": self.duration,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": fill(self.description)},
        }


def remedy_template() -> str:
    """A Go template that names the short remedy for ``$labels.cause``."""
    branches = [f'if eq $labels.cause "{cause}" }}}}{text}' for cause, text in c.CAUSE_REMEDY.items()]
    return "{{ " + "{{ else ".join(branches) + "{{ else }}see the runbook{{ end }}"


def running() -> str:
    return f"on ({c.PROCESS}) oomsight_process_up == 1"


def oom_alerts() -> list[Alert]:
    return [
        Alert(
            "OomsightCudaOutOfMemory",
            f"time() - max by ({c.EVENT}, cause) ({r.OOM_EVENT}) < {knob('oom_recent_seconds')}",
            "0m",
            "warning",
            "A PyTorch process ran out of CUDA memory.",
            f"{WHERE} hit a CUDA out-of-memory error {{{{ $value | humanizeDuration }}}} ago. "
            f"Diagnosed cause: {{{{ $labels.cause }}}}. Remedy: {remedy_template()}.",
        ),
    ]


def capacity_alerts() -> list[Alert]:
    near = [
        ("near_capacity_warning_ratio", T.near_capacity_warning_for, "warning"),
        ("near_capacity_critical_ratio", T.near_capacity_critical_for, "critical"),
    ]
    return [
        Alert(
            "OomsightGpuMemoryNearCapacity",
            f"{c.HEADROOM_RATIO} < {knob(ratio)}\nand {running()}",
            duration,
            severity,
            "GPU memory is nearly full at the training step's peak.",
            f"{WHERE} has only {{{{ $value | humanizePercentage }}}} of its GPU memory (its memory-fraction cap, "
            f"where set) left at its peak (alert below {knob(ratio, 'percent')}). The next larger batch or "
            "longer sequence runs out of memory.",
        )
        for ratio, duration, severity in near
    ]


def forecast_alerts() -> list[Alert]:
    horizon = knob("forecast_horizon_minutes")
    seconds = knob("forecast_horizon_minutes", "times", 60)
    lookback = knob("forecast_lookback")
    return [
        Alert(
            "OomsightCudaOomPredicted",
            r.promql(f"""
                (
                  oomsight_oom_forecast_earliest_seconds < {seconds}
                  or (
                    oomsight_oom_forecast_seconds < {seconds}
                    unless oomsight_oom_forecast_earliest_seconds
                  )
                  or (
                    predict_linear(oomsight_torch_window_peak_allocated_bytes[{lookback}], {seconds})
                      > oomsight_torch_window_peak_reserved_bytes + oomsight_gpu_headroom_bytes
                    and {c.HEADROOM_RATIO} < {knob("forecast_headroom_ratio")}
                    unless oomsight_oom_forecast_seconds
                  )
                )
                and {running()}"""),
            T.forecast_for,
            "warning",
            "GPU memory is on course to run out within the forecast horizon.",
            f"At the leak or growth of its step peaks, {WHERE} may run out of memory within {horizon} minutes "
            "(oomsight_oom_forecast_earliest_seconds, the earliest plausible time from the step-resolved memory "
            "and its noise; the central forecast is oomsight_oom_forecast_seconds, which hooks before wire 1.9 "
            "alone give; hooks without step rows: the growth "
            f"of the window peak over the last {lookback} while headroom is below "
            f"{knob('forecast_headroom_ratio', 'percent')}).",
        ),
        Alert(
            "OomsightCudaMemoryLeakSuspected",
            f"oomsight_leak_suspected == 1\nand {running()}",
            T.leak_for,
            "warning",
            "The memory that survives between training steps keeps growing: a leak.",
            f"The between-steps floor of allocated memory of {WHERE} rises step after step while each step's "
            "own memory does not, or, in a process with no optimizer step, the memory left after each forward "
            "that records a graph rises forward after forward (oomsight_leak_suspected). Classic cause: tensors "
            "kept alive with their autograd graph (loss, outputs) across steps or batches.",
        ),
    ]


def allocator_alerts() -> list[Alert]:
    return [
        Alert(
            "OomsightCudaMemoryFragmented",
            r.promql(f"""
                oomsight_torch_inactive_split_bytes / oomsight_torch_reserved_bytes > {knob("fragmentation_ratio")}
                and oomsight_torch_inactive_split_bytes > {knob("fragmentation_min_bytes")}
                and {running()}"""),
            T.fragmentation_for,
            "warning",
            "A large share of the memory PyTorch holds is fragmented.",
            f"{{{{ $value | humanizePercentage }}}} of the memory the caching allocator of {WHERE} holds "
            "sits free inside split blocks that no large tensor can use and empty_cache() cannot release.",
        ),
        Alert(
            "OomsightCudaMallocRetries",
            f"increase(oomsight_torch_alloc_retries_total[{knob('retries_window')}]) >= {knob('retries_min')}",
            T.retries_for,
            "warning",
            "PyTorch's allocator keeps flushing its cache to satisfy allocations.",
            f"cudaMalloc failed {{{{ $value | humanize }}}} times in {knob('retries_window')} for {WHERE}; each "
            "time the allocator freed its whole cache and retried. Steps slow down, and an OOM is close.",
        ),
    ]


def self_alerts() -> list[Alert]:
    return [
        Alert(
            "OomsightSidecarDown",
            sidecar_down_expr(),
            T.sidecar_down_for,
            "warning",
            "Prometheus cannot scrape the oomsight sidecar of a running pod.",
            "The oomsight sidecar {{ if $labels.pod }}of {{ $labels.namespace }}/{{ $labels.pod }} {{ end }}"
            "does not answer on {{ $labels.instance }} (job {{ $labels.job }}): no GPU memory data for this pod.",
        ),
        Alert(
            "OomsightHookSilent",
            f'oomsight_snapshot_age_seconds\nand on ({c.PROCESS}) oomsight_process_exit_info{{reason="vanished"}}',
            T.hook_silent_for,
            "warning",
            "A training process stopped publishing without exiting cleanly.",
            "Rank {{ $labels.rank }} of {{ $labels.namespace }}/{{ $labels.pod }} wrote its last "
            "snapshot {{ $value | humanizeDuration }} ago and never said it exited: it was killed "
            "(e.g. by the kernel OOM killer) or its oomsight hook stopped.",
        ),
        Alert(
            "OomsightHookMissing",
            f"group by ({c.POD}) (oomsight_build_info)\nunless on ({c.POD}) group by ({c.POD}) (oomsight_process_up)",
            T.hook_missing_for,
            "warning",
            "The oomsight sidecar runs, but no training process publishes to it.",
            "The sidecar of {{ $labels.namespace }}/{{ $labels.pod }} has seen no PyTorch process with the "
            "oomsight hook for a while: the hook is not loaded, CUDA is not used, or the "
            "training has ended and the pod keeps running.",
        ),
    ]


def sidecar_down_expr() -> str:
    """A sidecar target that fails, whatever the scrape mode: the PodMonitor sets ``container``;
    annotation-based scraping sets no container, but maps the pod's labels (the opt-in label) or at
    least keeps ``job`` and ``instance``, and a target that served ``oomsight_build_info`` within
    the lookback is a sidecar."""
    seen = f"last_over_time({c.SIDECAR_SEEN}[{c.SIDECAR_SEEN_LOOKBACK}])"
    return r.promql(f"""
        (
          up{{{c.SIDECAR_UP_SELECTOR}}}
          or up{{{c.SIDECAR_POD_LABEL_SELECTOR}}}
          or (up and on (job, instance) group by (job, instance) ({seen}))
        ) == 0""")


def webhook_alerts() -> list[Alert]:
    """The injection webhook: its serving certificate, admission errors, and whether it is up
    (the ServiceMonitor sets ``container="webhook"``; other scrapes are known by its own counter)."""
    seen = f"last_over_time({c.WEBHOOK_SEEN}[{c.SIDECAR_SEEN_LOOKBACK}])"
    days = knob("webhook_certificate_days")
    return [
        Alert(
            "OomsightWebhookCertificateExpiring",
            "oomsight_webhook_certificate_expiry_timestamp_seconds - time() < "
            + knob("webhook_certificate_days", "times", 86400),
            T.webhook_certificate_for,
            "warning",
            "The injection webhook's serving certificate expires soon.",
            "The certificate that {{ $labels.namespace }}/{{ $labels.pod }} serves the admission webhook with "
            f"expires in {{{{ $value | humanizeDuration }}}} (alert below {days} days). It renews 30 days ahead: "
            "renewal is failing (self-managed TLS: the Secret cannot be updated; cert-manager: the Certificate is "
            "not Ready). Once expired the API server cannot call the webhook and pods start without the sidecar.",
        ),
        Alert(
            "OomsightWebhookAdmissionErrors",
            f'increase(oomsight_webhook_admissions_total{{result="error"}}[{knob("webhook_errors_window")}]) '
            f">= {knob('webhook_errors_min')}",
            T.webhook_errors_for,
            "warning",
            "The injection webhook fails admission requests.",
            "{{ $labels.namespace }}/{{ $labels.pod }} answered {{ $value | humanize }} admission requests with "
            f"an error in {knob('webhook_errors_window')}: those pods were created without the oomsight sidecar "
            "(the webhook fails open). Its log names the pod and the error.",
        ),
        Alert(
            "OomsightWebhookDown",
            r.promql(f"""
                (
                  up{{{c.WEBHOOK_UP_SELECTOR}}}
                  or (up and on (job, instance) group by (job, instance) ({seen}))
                ) == 0"""),
            T.webhook_down_for,
            "warning",
            "Prometheus cannot scrape a pod of the oomsight injection webhook.",
            "The webhook pod {{ $labels.namespace }}/{{ $labels.pod }} does not answer on "
            "{{ $labels.instance }}. With every replica down, labelled pods start without the sidecar.",
        ),
    ]


def budget_alerts() -> list[Alert]:
    return [
        Alert(
            "OomsightGpuMemoryBudgetExceeded",
            f"{r.GPU_PEAK_PER_BUDGET} > {T.budget_exceeded_ratio:g}",
            T.budget_exceeded_for,
            "warning",
            "A pod uses more GPU memory than it claimed through DRA.",
            "The PyTorch processes of {{ $labels.namespace }}/{{ $labels.pod }} peak at "
            "{{ $value | humanizePercentage }} of the GPU memory the pod claimed (its ResourceClaim's "
            "consumedCapacity) on GPU {{ $labels.gpu_uuid }}: the excess is memory promised to the GPU's other "
            "claims, and nothing inside CUDA stops it. Its neighbours run out of memory first.",
        ),
    ]


def waste_alerts() -> list[Alert]:
    w = knob("underused_window")
    return [
        Alert(
            "OomsightGpuMemoryUnderused",
            r.promql(f"""
                max_over_time({r.GPU_PEAK_RESERVED}[{w}]) / {r.GPU_TOTAL} < {knob("underused_peak_ratio")}
                and on ({c.POD}, gpu_uuid) ({r.GPU_TOTAL} offset {w})"""),
            T.underused_for,
            "info",
            "A GPU's memory has been badly underused for hours.",
            f"For {w} the PyTorch processes of {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}} peaked at "
            f"{{{{ $value | humanizePercentage }}}} of GPU {{{{ $labels.gpu_uuid }}}}. A larger batch would "
            "train faster, or a smaller GPU (or MIG slice) would do.",
        ),
    ]


def rightsizing_alerts() -> list[Alert]:
    """A pod's DRA memory claim against its workload's observed need over the right-sizing window (the
    exact lifetime peak reserved plus the memory outside the allocator; docs/kubernetes.md, "Right-sizing")."""
    window = knob("rightsizing_window")
    ratio = f"{r.POD_BUDGET}\n/ on ({c.WORKLOAD}) group_left () {r.RS_NEED_WINDOW}"
    return [
        Alert(
            "OomsightGpuMemoryClaimBelowPeak",
            f"{ratio}\n< {T.claim_below_peak_ratio:g}",
            T.claim_below_peak_for,
            "warning",
            "A pod claims less GPU memory than its workload's runs have needed.",
            "{{ $labels.namespace }}/{{ $labels.pod }} claimed through DRA {{ $value | humanizePercentage }} of "
            f"the GPU memory the runs of workload {{{{ $labels.workload }}}} needed at their peak within {window} "
            "(lifetime peak reserved plus the memory outside PyTorch's allocator, and the failed allocation of a "
            "run that died of an OOM). It runs out of memory where those runs peaked, or takes memory promised to "
            "the GPU's other claims. `oomsight recommend` gives the request.",
        ),
        Alert(
            "OomsightGpuMemoryClaimOversized",
            r.promql(f"""
                {ratio}
                > {knob("claim_oversized_factor")}
                and on ({c.WORKLOAD}) last_over_time({r.RS_NEED}[{window}] offset {window})"""),
            T.claim_oversized_for,
            "info",
            "A pod claims far more GPU memory than its workload has needed over a whole window.",
            "{{ $labels.namespace }}/{{ $labels.pod }} claimed through DRA {{ $value | humanize }} times the GPU "
            f"memory the runs of workload {{{{ $labels.workload }}}} needed at their peak within {window}, and the "
            f"workload has been observed for longer than that (alert above {knob('claim_oversized_factor')} "
            "times). The rest idles: `oomsight recommend` gives a request that fits.",
        ),
    ]


def device_bytes(metric: str) -> str:
    """A Go template that prints ``metric`` of the alert's rank and GPU in bytes (``30Gi`` + ``B``), by a
    query when the alert is evaluated: a description can show two numbers where ``$value`` holds one."""
    labels = ("cluster", "namespace", "pod", "rank", "device")
    selector = ", ".join(f"{label}=%q" for label in labels)
    args = " ".join(f"$labels.{label}" for label in labels)
    query = f'printf "{metric}{{{selector}}}" {args} | query'
    return f"{{{{ with {query} }}}}{{{{ . | first | value | humanize1024 }}}}B{{{{ end }}}}"


def prediction_alerts() -> list[Alert]:
    """A rank whose measured peak outgrew the peak ``oomsight predict`` gave its job (the job carries it:
    ``OOMSIGHT_PREDICTION``, the webhook's ``oomsight.io/predicted-peak-bytes``; docs/prediction.md)."""
    measured = device_bytes("oomsight_torch_peak_allocated_bytes")
    predicted = device_bytes("oomsight_predicted_peak_allocated_bytes")
    return [
        Alert(
            "OomsightPeakAbovePrediction",
            r.promql(f"""
                oomsight_torch_peak_allocated_bytes
                / on ({c.DEVICE}) oomsight_predicted_peak_allocated_bytes
                > 1 + {knob("prediction_margin_ratio")}
                and {running()}"""),
            T.prediction_exceeded_for,
            "warning",
            "A training process needs more GPU memory than oomsight predict said it would.",
            f"{WHERE} peaked at {measured} allocated, {{{{ $value | humanizePercentage }}}} of the {predicted} "
            f"its job's prediction gave (alert above {knob('prediction_margin_ratio', 'percent')} over it). "
            "Either the job runs otherwise than it was predicted (batch, sequence length, model, parallelism) or "
            "the predictor missed; sized by the prediction, it has less headroom than planned.",
        ),
    ]


def all_alerts() -> list[Alert]:
    return [
        *oom_alerts(),
        *capacity_alerts(),
        *forecast_alerts(),
        *allocator_alerts(),
        *self_alerts(),
        *webhook_alerts(),
        *budget_alerts(),
        *waste_alerts(),
        *rightsizing_alerts(),
        *prediction_alerts(),
    ]


def add_runbook_links(groups: list[dict[str, Any]], pattern: str) -> list[dict[str, Any]]:
    """Give every alert that lacks one a ``runbook_url`` built from ``pattern`` ({alert} = name, lower case)."""
    for group in groups:
        for rule in group["rules"]:
            if "alert" in rule:
                annotations = rule.setdefault("annotations", {})
                annotations.setdefault("runbook_url", pattern.format(alert=rule["alert"].lower()))
    return groups


def alert_group() -> dict[str, Any]:
    return {"name": "oomsight.alerts", "rules": [a.rule() for a in all_alerts()]}


def rule_spec() -> dict[str, Any]:
    """The rule file as data for the chart's ``templates/prometheusrule.yaml``: expressions and
    descriptions as :func:`knob.parts`, ``for`` and ``severity`` as defaults the values override."""
    records = [{"record": rule["record"], "expr": parts(rule["expr"])} for rule in r.recording_rules()]
    alerting = [
        {
            "alert": a.name,
            "expr": parts(a.expr),
            "for": a.duration,
            "severity": a.severity,
            "summary": a.summary,
            "description": parts(a.description),
        }
        for a in all_alerts()
    ]
    return {"groups": [{"name": "oomsight.rules", "rules": records}, {"name": "oomsight.alerts", "rules": alerting}]}


def rule_groups(pattern: str = c.RUNBOOK_URL_PATTERN) -> list[dict[str, Any]]:
    """The whole rule file: recording rules first, then alerts with their runbook links."""
    return add_runbook_links([r.recording_group(), alert_group()], pattern)
