"""``oomsight recommend``: what each workload should request for its GPU memory, from what Prometheus
recorded (docs/kubernetes.md, "Right-sizing"; docs/cli.md).

Per workload (the pod's controller, from the sidecar's owner info) and GPU: the exact lifetime peak the
caching allocator reserved, plus what it cannot see (CUDA context, NCCL, cuBLAS workspaces), plus the
allocation that failed in a run that died of an OOM (such a run needed at least that), at its highest
within the window; plus a margin. Then the smallest MIG profile and GPU that hold it
(``oomsight.tools.catalogue``), the memory granted now beyond it, and a DRA ``ResourceClaimTemplate`` that
claims it. The series are the recording rules of the chart (``dashboards/rules.py``, the ``RS_*`` names:
the same strings as below, a test compares them); the PromQL is only selectors and ``max_over_time``
over them, sent to Prometheus's HTTP API (``/api/v1/query``) with the standard library.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

from oomsight.analysis.units import format_bytes
from oomsight.tools import catalogue, exitcode

PEAK = "namespace_workload_pod_gpu:oomsight_torch_peak_reserved_bytes:sum"
OUTSIDE = "namespace_workload_pod_gpu:oomsight_gpu_non_torch_bytes:sum"
OOM_ASK = "namespace_workload_pod_gpu:oomsight_last_oom_requested_bytes:sum"
NEED = "namespace_workload:memory_need_bytes:max"
GRANTED = "namespace_workload_pod_gpu:memory_granted_bytes:min"
BUDGET = "namespace_workload_pod:oomsight_gpu_memory_budget_bytes:min"
OOM_EVENT = "namespace_workload_pod_rank_device_cause:oomsight_last_oom_timestamp_seconds:max"
SERIES = {"RS_PEAK": PEAK, "RS_OUTSIDE": OUTSIDE, "RS_OOM_ASK": OOM_ASK, "RS_NEED": NEED, "RS_GRANTED": GRANTED}
"""The recording rules read, by their name in ``dashboards/rules.py``."""
WORKLOAD = "cluster, namespace, workload, workload_type"
DEFAULT_WINDOW = "7d"
"""The chart's ``prometheusRule.thresholds.rightsizingWindow`` default (a test keeps them equal)."""
DEFAULT_MARGIN = 0.10
"""The chart's ``rightsizingMarginRatio`` default."""
DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+")
TIMEOUT_SECONDS = 30.0
EXAMPLE = (
    "examples:\n  oomsight recommend --prometheus http://prometheus.monitoring:9090\n"
    "  oomsight recommend --prometheus http://localhost:9090 --workload llama-ft --window 30d --json"
)


class Refused(Exception):
    """A bad URL or window, or a Prometheus that cannot answer: one line for the user."""


@dataclasses.dataclass
class Workload:
    namespace: str
    workload: str
    kind: str
    cluster: str = ""
    need_bytes: float = 0.0
    """The observed peak per GPU: peak reserved + outside the allocator + a dead run's failed allocation."""
    peak_reserved_bytes: float = 0.0
    outside_bytes: float = 0.0
    oom_ask_bytes: float = 0.0
    granted_bytes: list[float] = dataclasses.field(default_factory=list)
    """What each of its running GPUs gives it now (a DRA claim, else the whole device)."""
    claimed: bool = False
    ooms: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def key(self) -> tuple[str, str, str]:
        return (self.cluster, self.namespace, self.workload)


def add(sub: Any) -> None:
    """Register the subcommand on the ``oomsight`` parser."""
    p = sub.add_parser(
        "recommend",
        help="the GPU memory each workload should request, from Prometheus",
        description="The GPU memory each workload should request (MIG profile, GPU, DRA capacity), from the "
        "peaks oomsight's recording rules keep in Prometheus.",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus's base URL (http or https)")
    p.add_argument("--workload", default=None, help="only this workload (the pod's controller name)")
    p.add_argument("--window", default=DEFAULT_WINDOW, help=f"a PromQL duration (default {DEFAULT_WINDOW})")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"added to the observed peak, a share (default {DEFAULT_MARGIN:g})")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of prose")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        client = Prometheus(args.prometheus)
        window = check_window(args.window)
        if not 0 <= args.margin < 10:
            raise Refused(f"--margin {args.margin:g}: a share of the observed peak, 0 to 10")
        workloads = gather(client, window, args.workload)
    except Refused as exc:
        print(f"oomsight recommend: {exc}", file=sys.stderr)
        return exitcode.USAGE
    if args.json:
        print(json.dumps(as_json(workloads, window, args.margin, args.workload), indent=1))
    else:
        print(as_text(workloads, window, args.margin, args.workload))
    return exitcode.OK


def check_window(text: str) -> str:
    if not DURATION.fullmatch(text or ""):
        raise Refused(f"--window {text!r} is not a PromQL duration (7d, 36h, 1w)")
    return text


class Prometheus:
    """Instant queries against ``/api/v1/query``."""

    def __init__(self, url: str, timeout: float = TIMEOUT_SECONDS) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise Refused(f"--prometheus {url!r} is not an http(s) URL (http://prometheus:9090)")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str) -> list[dict[str, Any]]:
        params = urllib.parse.urlencode({"query": expr, "time": f"{time.time():.3f}"})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{params}", timeout=self.timeout) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise Refused(f"{self.url} answered HTTP {exc.code} to {expr!r}: {_error_text(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            said = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason  # no "[Errno N]"
            raise Refused(f"cannot reach Prometheus at {self.url}: {said}") from None
        except ValueError:
            raise Refused(f"{self.url} is not a Prometheus API (the answer is not JSON)") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise Refused(f"{self.url} refused {expr!r}: {body.get('error') if isinstance(body, dict) else body}")
        return list(body["data"]["result"])


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read()).get("error", exc.reason))
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)


def selector(workload: Optional[str]) -> str:
    if workload is None:
        return ""
    return '{workload="' + workload.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def queries(window: str, workload: Optional[str]) -> dict[str, str]:
    """The PromQL ``recommend`` sends: the highest value of each recorded series within the window, per
    workload; the memory granted now per running GPU; each OOM of the window."""
    sel = selector(workload)

    def highest(series: str) -> str:
        return f"max by ({WORKLOAD}) (max_over_time({series}{sel}[{window}]))"

    return {
        "need": highest(NEED),
        "peak": highest(PEAK),
        "outside": highest(OUTSIDE),
        "oom_ask": highest(OOM_ASK),
        "granted": f"{GRANTED}{sel}",
        "claimed": f"{BUDGET}{sel}",
        "ooms": f"max_over_time({OOM_EVENT}{sel}[{window}])",
    }


def gather(client: Prometheus, window: str, workload: Optional[str]) -> list[Workload]:
    found: dict[tuple[str, str, str], Workload] = {}
    q = queries(window, workload)

    def each(name: str) -> list[tuple[Workload, dict[str, Any]]]:
        rows = []
        for series in client.query(q[name]):
            labels = series["metric"]
            key = (labels.get("cluster", ""), labels.get("namespace", ""), labels.get("workload", ""))
            if key not in found:
                found[key] = Workload(key[1], key[2], labels.get("workload_type", ""), key[0])
            rows.append((found[key], series))
        return rows

    for name, field in (("need", "need_bytes"), ("peak", "peak_reserved_bytes"), ("outside", "outside_bytes")):
        for w, s in each(name):
            setattr(w, field, float(s["value"][1]))
    for w, s in each("oom_ask"):
        w.oom_ask_bytes = float(s["value"][1])
    for w, s in each("granted"):
        w.granted_bytes.append(float(s["value"][1]))
    for w, _ in each("claimed"):
        w.claimed = True
    for w, s in each("ooms"):
        labels = s["metric"]
        w.ooms.append({k: labels.get(k, "") for k in ("pod", "rank", "device", "cause", "remedy")})
        w.ooms[-1]["time"] = float(s["value"][1])
    return sorted((w for w in found.values() if w.need_bytes > 0), key=lambda w: w.key())


def recommended_bytes(w: Workload, margin: float) -> float:
    return w.need_bytes * (1 + margin)


def waste_bytes(w: Workload, margin: float) -> float:
    return sum(max(g - recommended_bytes(w, margin), 0.0) for g in w.granted_bytes)


def claim_template(w: Workload, margin: float) -> dict[str, Any]:
    """A ``resource.k8s.io/v1`` ResourceClaimTemplate whose one request claims the recommended memory of a
    GPU as consumable capacity (``gpu.nvidia.com``: the device class of NVIDIA's DRA driver)."""
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "capacity": {"requests": {"memory": catalogue.quantity(recommended_bytes(w, margin))}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"{w.workload}-gpu", "namespace": w.namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def as_json(workloads: list[Workload], window: str, margin: float, workload: Optional[str]) -> dict[str, Any]:
    out = []
    for w in workloads:
        rec = recommended_bytes(w, margin)
        gpu_ = catalogue.smallest_gpu(rec)
        out.append(
            {
                "cluster": w.cluster,
                "namespace": w.namespace,
                "workload": w.workload,
                "workload_type": w.kind,
                "observed_peak_bytes": w.need_bytes,
                "peak_reserved_bytes": w.peak_reserved_bytes,
                "outside_allocator_bytes": w.outside_bytes,
                "oom_failed_allocation_bytes": w.oom_ask_bytes,
                "recommended_bytes": rec,
                "mig": [{"gpu": b.model, "profile": p.name} for b, p in catalogue.smallest_profiles(rec)],
                "gpu": gpu_.name if gpu_ else None,
                "granted_bytes": w.granted_bytes,
                "claimed": w.claimed,
                "waste_bytes": waste_bytes(w, margin),
                "ooms": w.ooms,
                "resource_claim_template": claim_template(w, margin),
            }
        )
    result: dict[str, Any] = {"window": window, "margin_ratio": margin, "workloads": out}
    if workload is not None and not out:
        result["no_history"] = no_history(workload, window)
    return result


def no_history(workload: str, window: str) -> str:
    return (
        f"no history for workload {workload!r} in the last {window}: nothing to size from yet. Start from "
        "`oomsight predict` for the same job (its peak reserved plus the CUDA context it counts), a prediction "
        "said as such, not a measurement; run it once with oomsight and ask again."
    )


def as_text(workloads: list[Workload], window: str, margin: float, workload: Optional[str]) -> str:
    if not workloads:
        return no_history(workload, window) if workload else f"no workload with GPU memory history in the last {window}"
    return "\n\n".join(_block(w, window, margin) for w in workloads)


def _block(w: Workload, window: str, margin: float) -> str:
    rec = recommended_bytes(w, margin)
    where = f"{w.cluster}/" if w.cluster else ""
    parts = [f"lifetime peak reserved {format_bytes(w.peak_reserved_bytes)}"]
    parts.append(f"outside the allocator {format_bytes(w.outside_bytes)}")
    if w.oom_ask_bytes:
        parts.append(f"{format_bytes(w.oom_ask_bytes)} a run that died of an OOM asked for")
    gpu_ = catalogue.smallest_gpu(rec)
    migs = ", ".join(f"{p.name} ({b.model})" for b, p in catalogue.smallest_profiles(rec)) or "none fits"
    granted = "a DRA claim" if w.claimed else "the whole device"
    lines = [
        f"{where}{w.namespace}/{w.workload} ({w.kind or 'unknown kind'}), per GPU, over {window}",
        f"  observed peak    {format_bytes(w.need_bytes)} = " + " + ".join(parts),
        f"  recommended      {format_bytes(rec)} (observed peak + {margin:.0%})",
        f"  smallest MIG     {migs}",
        f"  smallest GPU     {gpu_.name + ' (' + format_bytes(gpu_.total_bytes) + ')' if gpu_ else 'none fits'}",
        f"  waste now        {format_bytes(waste_bytes(w, margin))} on {len(w.granted_bytes)} running GPU(s)"
        + (f", each granted {granted}" if w.granted_bytes else ""),
    ]
    for oom in sorted(w.ooms, key=lambda o: o["time"]):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(oom["time"]))
        lines.append(f"  OOM in window    {oom['pod']} rank {oom['rank']} GPU {oom['device']} at {stamp}: "
                     f"{oom['cause'] or 'cause unknown'}")  # fmt: skip
    if w.ooms:
        lines.append("                   the recommendation is not below what a run that died of an OOM held plus "
                     "the allocation that failed; a leak needs its fix, not more memory")  # fmt: skip
    lines.append("  DRA claim (resource.k8s.io/v1, consumable capacity):")
    lines.extend("    " + line for line in _yaml(claim_template(w, margin)))
    return "\n".join(lines)


def _yaml(doc: Any, indent: int = 0) -> list[str]:
    """``doc`` (dicts, lists of dicts, strings) as block YAML; the library installs no YAML package."""
    pad = "  " * indent
    out: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict):
            out.append(f"{pad}{key}:")
            out.extend(_yaml(value, indent + 1))
        elif isinstance(value, list):
            out.append(f"{pad}{key}:")
            for item in value:
                lines = _yaml(item, indent + 2)
                out.append(f"{pad}  - {lines[0].lstrip()}")
                out.extend(lines[1:])
        else:
            out.append(f"{pad}{key}: {value}")
    return out
