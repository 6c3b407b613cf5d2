"""What the webhook injects: cluster-wide settings (from ``OOMSIGHT_INJECT_*``, set by the
chart) and their per-pod overrides (``oomsight.io/...`` annotations).

A bad annotation never blocks a pod: the override is ignored and the admission response
carries a warning that ``kubectl`` prints.
"""

from __future__ import annotations

import dataclasses
import decimal
import os
import re
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar

from oomsight.config import ENV_PREDICTION, ConfigError, ascii_bool, ascii_int
from oomsight.config.table import defaults, read_group, variables
from oomsight.config.variables import DEFAULT_ADMIN_PORT, INJECT
from oomsight.wire.fields import PREDICTED_PEAK_ANNOTATION

_VARIABLE = variables(INJECT)
_DEFAULT = defaults(INJECT, "inject")
# The variables this module and the webhook's start-up name in messages, as the table gives them.
ENV_IMAGE = _VARIABLE["inject_image"]
ENV_NATIVE = _VARIABLE["inject_native_sidecar"]
ENV_KUBE_VERSION_HINT = _VARIABLE["inject_kube_version_hint"]
ENV_METRICS_PORT = _VARIABLE["inject_metrics_port"]
ENV_RUN_AS_USER = _VARIABLE["inject_run_as_user"]
ENV_DRAIN = _VARIABLE["inject_drain_seconds"]
RESOURCE_FIELDS = ("cpu_request", "memory_request", "cpu_limit", "memory_limit")

PREFIX = "oomsight.io/"
ANN_INJECT_PYTHON = PREFIX + "inject-python"
ANN_CONTAINERS = PREFIX + "containers"
ANN_NATIVE = PREFIX + "native-sidecar"
ANN_METRICS_PORT = PREFIX + "metrics-port"
ANN_SPOOL_SIZE = PREFIX + "spool-size-limit"
ANN_EVENTS = PREFIX + "events"
ANN_PROFILE_EVERY = PREFIX + "profile-every-seconds"
ANN_PROFILE_STEPS = PREFIX + "profile-steps"
"""Scheduled profiling windows (memory-only by default): set as OOMSIGHT_PROFILE_* in the target containers."""
PROFILE_STEPS_MAX = 100
PROFILE_EVERY_MAX_SECONDS = 7 * 86_400
ANN_PREDICTED_PEAK = PREDICTED_PEAK_ANNOTATION
"""Written by ``oomsight predict --annotate``: the predicted peak allocated bytes. The target containers
get ``OOMSIGHT_PREDICTION`` from it through the downward API (``docs/prediction.md``)."""
PREDICTED_PEAK_MAX = 2**63 - 1
ANN_RESOURCES = {
    "cpu_request": PREFIX + "sidecar-cpu-request",
    "memory_request": PREFIX + "sidecar-memory-request",
    "cpu_limit": PREFIX + "sidecar-cpu-limit",
    "memory_limit": PREFIX + "sidecar-memory-limit",
}
ANN_STATUS = PREFIX + "status"
"""Written by the webhook: ``injected``."""

NATIVE_SIDECARS_SINCE = (1, 29)
"""Native sidecars (init containers with ``restartPolicy: Always``) are on by default from 1.29."""

_QUANTITY = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|[KMGTPE]i|[mkMGTPE])?$")
_SUFFIX_FACTORS = {
    **{s + "i": 1024 ** (n + 1) for n, s in enumerate("KMGTPE")},
    **{s: 1000 ** (n + 1) for n, s in enumerate("kMGTPE")},
    "m": decimal.Decimal("0.001"),
    "": 1,
}
QUANTITY_MAX = 2**63 - 1
"""The largest quantity Kubernetes keeps as a whole number (an int64)."""
V = TypeVar("V")


@dataclasses.dataclass(frozen=True)
class Resources:
    """Requests and limits of the injected containers; an empty string leaves one unset."""

    cpu_request: str = str(_DEFAULT["cpu_request"])
    """CPU the sidecar requests (it reads a few small files per scrape)."""

    memory_request: str = str(_DEFAULT["memory_request"])
    """Memory the sidecar requests (Python, prometheus_client and the kubernetes client)."""

    cpu_limit: str = str(_DEFAULT["cpu_limit"])
    """CPU limit; unset by default so scrapes are never throttled."""

    memory_limit: str = str(_DEFAULT["memory_limit"])
    """Memory limit of the sidecar."""

    def as_spec(self) -> dict[str, dict[str, str]]:
        requests = {k: v for k, v in (("cpu", self.cpu_request), ("memory", self.memory_request)) if v}
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if v}
        return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


@dataclasses.dataclass(frozen=True)
class InjectionSettings:
    """Cluster-wide injection settings; the chart sets every one from ``values.yaml``."""

    image: str
    """The oomsight image (sidecar and zero-code init container)."""

    image_pull_policy: str = str(_DEFAULT["image_pull_policy"])
    """Pull policy of the injected containers."""

    native_sidecar: bool = True
    """Inject as a native sidecar (Kubernetes >= 1.29) so Jobs complete; else a regular container."""

    containers: str = str(_DEFAULT["containers"])
    """Which containers get the spool and env: ``gpu`` (those that ask for a GPU) or ``all``."""

    gpu_resources: tuple[str, ...] = tuple(str(_DEFAULT["gpu_resources"]).split(","))
    """Resource names (or prefixes) that mean "this container asks for a GPU"."""

    spool_size_limit: str = str(_DEFAULT["spool_size_limit"])
    """``sizeLimit`` of the memory-backed spool ``emptyDir`` (it counts as the pod's memory)."""

    metrics_port: int = int(_DEFAULT["metrics_port"])  # type: ignore[arg-type]
    """The sidecar's metrics port, named ``metrics``."""

    resources: Resources = dataclasses.field(default_factory=Resources)
    """Requests and limits of the sidecar."""

    run_as_user: int = int(_DEFAULT["run_as_user"])  # type: ignore[arg-type]
    """The fixed non-root UID/GID of the injected containers."""

    scrape_annotations: bool = bool(_DEFAULT["scrape_annotations"])
    """Add ``prometheus.io/scrape|port|path`` to the pod (for Prometheus without the operator)."""

    events: bool = bool(_DEFAULT["events"])
    """Let the sidecar post Kubernetes Events on OOM (it still needs the RBAC grant)."""

    resource_claims: bool = bool(_DEFAULT["resource_claims"])
    """Let the sidecar read its pod's DRA memory budget from its ResourceClaims (the chart's
    ``rbac.resourceClaims``, which also grants it); the sidecar gets ``OOMSIGHT_RESOURCE_CLAIMS=1``."""

    zero_code: bool = bool(_DEFAULT["zero_code"])
    """Honour ``oomsight.io/inject-python: "true"`` (the pod still has to opt in)."""

    drain_seconds: float = float(_DEFAULT["drain_seconds"])  # type: ignore[arg-type]
    """The sidecar's ``OOMSIGHT_DRAIN_SECONDS``: serve this long after SIGTERM for a last scrape."""

    admin_port: Optional[int] = DEFAULT_ADMIN_PORT
    """The sidecar's admin port on its loopback: 0 off, None (``auto``) the system picks one.
    ``hostNetwork`` pods always get ``auto`` and a required token."""

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, native_sidecar: bool = True) -> InjectionSettings:
        """The ``OOMSIGHT_INJECT_*`` rows (``oomsight.config.variables.INJECT``) that ``env`` sets;
        ``native_sidecar`` as decided at start from ``OOMSIGHT_INJECT_NATIVE_SIDECAR``
        (:func:`oomsight_webhook.main.resolve_native_sidecar`)."""
        values = read_group(INJECT, "inject", os.environ if env is None else env)
        if not values.get("image"):
            raise ConfigError(f"{ENV_IMAGE} is required: the image of the sidecar to inject")
        for field in ("spool_size_limit", *RESOURCE_FIELDS):
            raw = str(values.get(field, ""))
            if raw and not _QUANTITY.match(raw):
                name = _VARIABLE["inject_" + field]
                raise ConfigError(f"{name}={raw!r} is not a Kubernetes quantity (e.g. 100m, 128Mi)")
        resources = Resources(**{f: values.pop(f) for f in RESOURCE_FIELDS if f in values})  # type: ignore[arg-type]
        for unused in ("native_sidecar", "kube_version_hint"):
            values.pop(unused, None)
        gpu = tuple(x.strip() for x in str(values.pop("gpu_resources", "")).split(",") if x.strip())
        settings = cls(
            **values,  # type: ignore[arg-type]
            native_sidecar=native_sidecar,
            resources=resources,
            **({"gpu_resources": gpu} if gpu else {}),  # type: ignore[arg-type]
        )
        settings.validate()
        return settings

    @staticmethod
    def native_mode(env: Mapping[str, str]) -> tuple[str, str]:
        """``OOMSIGHT_INJECT_NATIVE_SIDECAR`` (``auto``, ``true``, ``false``) and the chart's
        ``OOMSIGHT_INJECT_KUBE_VERSION_HINT``, read through the table."""
        values = {**_DEFAULT, **read_group(INJECT, "inject", env)}
        return str(values["native_sidecar"]), str(values["kube_version_hint"])

    def validate(self) -> None:
        if not 1 <= self.metrics_port <= 65535 or self.run_as_user < 1:
            raise ConfigError(f"{ENV_METRICS_PORT} must be a port and {ENV_RUN_AS_USER} a non-root UID")
        if not 0 <= self.drain_seconds <= 3600:
            raise ConfigError(f"{ENV_DRAIN}={self.drain_seconds} must be between 0 and 3600 seconds")


@dataclasses.dataclass(frozen=True)
class PodOptions:
    """The settings for one pod after its annotations are applied."""

    native_sidecar: bool
    container_names: Optional[tuple[str, ...]]
    metrics_port: int
    spool_size_limit: str
    resources: Resources
    inject_python: bool
    events: bool
    profile_every_seconds: Optional[int] = None
    profile_steps: Optional[int] = None
    admin_port: Optional[int] = DEFAULT_ADMIN_PORT
    """The sidecar's ``OOMSIGHT_ADMIN_PORT``: 0 off (the pod uses the port), None ``auto``."""
    host_network: bool = False
    """The pod shares the node's network: the admin endpoint then requires a token."""
    artifacts_max_bytes: Optional[int] = None
    """``OOMSIGHT_ARTIFACTS_MAX_BYTES`` for the target containers, derived from the spool
    volume's ``sizeLimit`` (``oomsight.wire.spool.artifacts_cap_bytes``); None sets nothing."""
    predicted_peak: bool = False
    """The pod carries :data:`ANN_PREDICTED_PEAK` as a string: the target containers get
    ``OOMSIGHT_PREDICTION`` from it, by reference, so the hook reads the annotation's own value."""


def pod_options(
    settings: InjectionSettings,
    annotations: Mapping[str, str],
    taken_ports: frozenset[int] = frozenset(),
    host_network: bool = False,
) -> tuple[PodOptions, list[str]]:
    """Apply ``oomsight.io/...`` annotations; a bad value is ignored with a warning.

    ``taken_ports``: the ports the pod's own containers declare. The sidecar's metrics and
    admin ports never collide with them or with each other (docs/kubernetes.md, "Ports")."""
    ann = _Overrides(annotations)
    inject_python = ann.get(ANN_INJECT_PYTHON, False, _bool_or_none, "true or false")
    if inject_python and not settings.zero_code:
        ann.warnings.append(f"oomsight: {ANN_INJECT_PYTHON} is switched off in this cluster (zeroCode.enabled)")
        inject_python = False
    resources = Resources(
        **{
            field: ann.get(key, getattr(settings.resources, field), _quantity_or_none, "a quantity like 128Mi")
            for field, key in ANN_RESOURCES.items()
        }
    )
    names = annotations.get(ANN_CONTAINERS)
    opts = PodOptions(
        native_sidecar=ann.get(ANN_NATIVE, settings.native_sidecar, _bool_or_none, "true or false"),
        container_names=tuple(n.strip() for n in names.split(",") if n.strip()) if isinstance(names, str) else None,
        metrics_port=ann.get(ANN_METRICS_PORT, settings.metrics_port, _port_or_none, "a port number (1 to 65535)"),
        spool_size_limit=ann.get(ANN_SPOOL_SIZE, settings.spool_size_limit, _quantity_or_none, "a quantity"),
        resources=resources,
        inject_python=inject_python,
        events=ann.get(ANN_EVENTS, settings.events, _bool_or_none, "true or false"),
        profile_every_seconds=ann.get(ANN_PROFILE_EVERY, None, _positive_or_none, "a whole number of seconds"),
        profile_steps=ann.get(ANN_PROFILE_STEPS, None, _steps_or_none, f"1 to {PROFILE_STEPS_MAX} steps"),
        host_network=host_network,
        predicted_peak=_predicted_peak(annotations.get(ANN_PREDICTED_PEAK), ann.warnings),
    )
    return _free_ports(opts, settings, taken_ports, ann.warnings), ann.warnings


def _free_ports(
    opts: PodOptions, settings: InjectionSettings, taken: frozenset[int], warnings: list[str]
) -> PodOptions:
    """Metrics and admin ports moved off the pod's own ports (and off each other), with a warning."""
    metrics = opts.metrics_port
    if metrics in taken or metrics == settings.admin_port:
        if metrics != settings.metrics_port:
            warnings.append(f"oomsight: ignored {ANN_METRICS_PORT}={metrics}: the pod or the admin endpoint uses it")
        metrics = settings.metrics_port
        busy = taken | {settings.admin_port or 0}
        if metrics in busy:
            metrics = next(p for p in range(metrics + 1, 65536) if p not in busy)
            warnings.append(
                f"oomsight: the pod uses port {settings.metrics_port}; the sidecar serves metrics on {metrics}"
            )
    admin: Optional[int] = None if opts.host_network else settings.admin_port
    if admin and (admin in taken or admin == metrics):
        warnings.append(f"oomsight: the pod uses port {admin}; the sidecar's admin endpoint is off")
        admin = 0
    return dataclasses.replace(opts, metrics_port=metrics, admin_port=admin)


class _Overrides:
    """Reads annotations, collecting a warning for every value it has to ignore."""

    def __init__(self, annotations: Mapping[str, str]) -> None:
        self.annotations = annotations
        self.warnings: list[str] = []

    def get(self, key: str, default: V, parse: Callable[[str], Optional[V]], expected: str) -> V:
        raw = self.annotations.get(key)
        if raw is None:
            return default
        value = parse(str(raw).strip())
        if value is None:
            self.warnings.append(f"oomsight: ignored {key}={str(raw)[:40]!r}: expected {expected}")
            return default
        return value


def _predicted_peak(raw: object, warnings: list[str]) -> bool:
    """Whether to hand the annotation to the hook. Any string is handed on: the hook reads it as
    ``OOMSIGHT_PREDICTION`` and counts a value it cannot use (``oomsight_hook_errors_total``), where
    the fleet sees it; one that is not a whole number of bytes also gets a warning here."""
    if raw is None:
        return False
    if not isinstance(raw, str):  # only a malformed review: the API server keeps annotations as strings
        warnings.append(f"oomsight: ignored {ANN_PREDICTED_PEAK}={str(raw)[:40]!r}: expected a whole number of bytes")
        return False
    if _whole_or_none(raw.strip(), 1, PREDICTED_PEAK_MAX) is None:
        warnings.append(
            f"oomsight: {ANN_PREDICTED_PEAK}={raw[:40]!r} is not a whole number of bytes; the hook gets it as "
            f"{ENV_PREDICTION} and counts a value it cannot read as an error"
        )
    return True


def native_sidecars_supported(git_version: str) -> Optional[bool]:
    """``v1.29.3-gke.1`` -> True; None when the version cannot be read."""
    m = re.match(r"^v?(\d+)\.(\d+)", git_version.strip())
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))) >= NATIVE_SIDECARS_SINCE


def _bool_or_none(raw: str) -> Optional[bool]:
    return ascii_bool(raw)


def is_quantity(raw: str) -> bool:
    """``raw`` is written as a Kubernetes quantity (whatever its size)."""
    return _QUANTITY.match(raw.strip()) is not None


def _quantity_or_none(raw: str) -> Optional[str]:
    return raw if is_quantity(raw) else None


def quantity_bytes(raw: str) -> Optional[int]:
    """The whole number of a Kubernetes quantity (``256Mi``, ``1G``, ``1.5Gi``, ``2e9``, ``100m``),
    rounded up as Kubernetes rounds; None if ``raw`` is not a quantity or it is over
    :data:`QUANTITY_MAX`. Exact (decimal) and cheap whatever its digits or exponent."""
    m = _QUANTITY.match(raw.strip())
    if m is None:
        return None
    number, suffix = decimal.Decimal(m.group(1)), m.group(3) or ""
    exponent = 0
    if suffix not in _SUFFIX_FACTORS:  # an exponent (e9, E-3); "Ei" and "E" are suffixes
        digits = suffix[1:].lstrip("+-").lstrip("0")
        exponent = int(digits or "0") if len(digits) <= 4 else 10**4  # past 10^4: out of range anyway
        exponent = -exponent if suffix[1] == "-" else exponent
        suffix = ""
    if number and number.adjusted() + exponent > 30:  # > 10^30 whatever the factor: over the maximum
        return None
    with decimal.localcontext() as ctx:
        ctx.prec, ctx.traps[decimal.Inexact], ctx.traps[decimal.Underflow] = 80, False, False
        value = number.scaleb(max(exponent, -100)) * _SUFFIX_FACTORS[suffix]
        whole = int(value.to_integral_value(rounding=decimal.ROUND_CEILING))
    return whole if whole <= QUANTITY_MAX else None


def _whole_or_none(raw: str, low: int, high: int) -> Optional[int]:
    """ASCII digits only (``str.isdigit()`` takes ``²``, ``①`` and 4,300-digit numbers)."""
    value = ascii_int(raw) if raw[:1] != "+" else None
    return value if value is not None and low <= value <= high else None


def _positive_or_none(raw: str) -> Optional[int]:
    return _whole_or_none(raw, 1, PROFILE_EVERY_MAX_SECONDS)


def _steps_or_none(raw: str) -> Optional[int]:
    return _whole_or_none(raw, 1, PROFILE_STEPS_MAX)


def _port_or_none(raw: str) -> Optional[int]:
    return _whole_or_none(raw, 1, 65535)
