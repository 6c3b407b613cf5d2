"""The admission logic as a pure function: a pod in, a JSONPatch and warnings out.

Idempotent: every step first checks whether its object is already there (by name),
so a pod injected twice (``reinvocationPolicy: IfNeeded``, or a pod re-created from a
dumped manifest) gets an empty patch the second time. It never raises on odd input:
anything it cannot understand yields an empty patch and a warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Optional

from oomsight.config import (
    ENV_ARTIFACTS_MAX_BYTES,
    ENV_DIR,
    ENV_PREDICTION,
    ENV_PROFILE_EVERY,
    ENV_PROFILE_STEPS,
    ENV_TERMINATION_MESSAGE_PATH,
)
from oomsight.wire.spool import artifacts_cap_bytes
from oomsight_server.owner import controller_owner
from oomsight_webhook.injection import (
    ANN_PREDICTED_PEAK,
    ANN_STATUS,
    QUANTITY_MAX,
    InjectionSettings,
    PodOptions,
    is_quantity,
    pod_options,
    quantity_bytes,
)
from oomsight_webhook.patch import PatchBuilder, pointer
from oomsight_webhook.podspec import (
    SIDECAR_NAME,
    SPOOL_PATH,
    SPOOL_VOLUME,
    STARTUP_NAME,
    STARTUP_PATH,
    STARTUP_VOLUME,
    field_env,
    sidecar_container,
    spool_volume,
    startup_container,
    startup_volume,
    token_mount,
)

Json = dict[str, Any]
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
ARTIFACTS_ENV_MAX = 10**18 - 1
"""The largest ``OOMSIGHT_ARTIFACTS_MAX_BYTES`` the hook's settings read (18 digits)."""


@dataclasses.dataclass
class Mutation:
    patch: list[Json]
    warnings: list[str]


def mutate(pod: Any, settings: InjectionSettings) -> Mutation:
    """The patch that injects oomsight into ``pod`` (a Pod object as JSON)."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return Mutation([], ["oomsight: the object has no pod spec; nothing injected"])
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers or not all(isinstance(c, Mapping) for c in containers):
        return Mutation([], ["oomsight: the pod has no containers; nothing injected"])
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return Mutation([], ["oomsight: the pod has no metadata; nothing injected"])
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else None
    opts, warnings = pod_options(settings, annotations or {}, pod_ports(spec), spec.get("hostNetwork") is True)
    bound, note = artifacts_bound(spec, opts)
    opts = dataclasses.replace(opts, artifacts_max_bytes=bound)
    warnings += note
    b = PatchBuilder()
    targets, note = target_containers(containers, settings, opts)
    warnings += note
    _ensure_volume(b, spec, SPOOL_VOLUME, lambda: spool_volume(opts))
    if opts.inject_python:  # before the sidecar, so the init container runs ahead of it
        warnings += _ensure_zero_code(b, spec, settings, targets)
    warnings += _ensure_sidecar(b, pod, spec, settings, opts)
    for i in targets:
        _ensure_spool_access(b, i, containers[i], opts)
        warnings += _ensure_prediction(b, i, containers[i], opts)
    warnings += _ensure_annotations(b, annotations, settings, opts)
    if b.ops:
        b.put(pointer("metadata", "annotations"), annotations, ANN_STATUS, "injected")
    return Mutation(b.ops, warnings)


def pod_ports(spec: Mapping[str, Any]) -> frozenset[int]:
    """Every ``containerPort`` (and ``hostPort``) the pod's containers declare, ours excepted."""
    found: set[int] = set()
    for key in ("containers", "initContainers"):
        for container in _list(spec.get(key)) or []:
            if not isinstance(container, Mapping) or container.get("name") == SIDECAR_NAME:
                continue
            for port in _list(container.get("ports")) or []:
                if isinstance(port, Mapping):
                    found.update(p for p in (port.get("containerPort"), port.get("hostPort")) if isinstance(p, int))
    return frozenset(found)


def artifacts_bound(spec: Mapping[str, Any], opts: PodOptions) -> tuple[Optional[int], list[str]]:
    """``OOMSIGHT_ARTIFACTS_MAX_BYTES`` for the target containers: :func:`artifacts_cap_bytes` (half)
    of the spool volume's ``sizeLimit`` — the one injected, or that of the pod's own
    ``oomsight-spool`` ``emptyDir``; None when that volume has no size we can read. A valid
    quantity too large for an int64 (``8Ei``) is clamped to :data:`ARTIFACTS_ENV_MAX`, with a
    warning: the pod is still injected."""
    volumes = _list(spec.get("volumes")) or []
    own = next((v for v in volumes if isinstance(v, Mapping) and v.get("name") == SPOOL_VOLUME), None)
    if own is None:
        limit: Any = opts.spool_size_limit
    else:
        empty = own.get("emptyDir")
        limit = empty.get("sizeLimit") if isinstance(empty, Mapping) else None
    if isinstance(limit, bool) or not isinstance(limit, (str, int)):
        return None, []
    size = quantity_bytes(str(limit))
    if size is None and is_quantity(str(limit)):
        note = f"oomsight: the spool's sizeLimit {str(limit)[:40]} is over {QUANTITY_MAX} bytes; artifacts capped at "
        return ARTIFACTS_ENV_MAX, [note + f"{ARTIFACTS_ENV_MAX} bytes"]
    return (None if size is None else min(artifacts_cap_bytes(size), ARTIFACTS_ENV_MAX)), []


def target_containers(
    containers: list[Any], settings: InjectionSettings, opts: PodOptions
) -> tuple[list[int], list[str]]:
    """Indexes of the containers that get the spool and env, and a warning if the choice is odd."""
    names = [str(c.get("name", "")) for c in containers]
    everyone = [i for i, n in enumerate(names) if n != SIDECAR_NAME]  # never the sidecar (a regular one)
    if opts.container_names is not None:
        unknown = sorted(set(opts.container_names) - {names[i] for i in everyone})
        chosen = [i for i in everyone if names[i] in opts.container_names]
        return chosen, [f"oomsight: no container named {', '.join(unknown)}"] if unknown else []
    if settings.containers == "all":
        return everyone, []
    gpu = [i for i in everyone if asks_for_gpu(containers[i], settings.gpu_resources)]
    if gpu:
        return gpu, []
    return everyone, ["oomsight: no container asks for a GPU; the spool goes to all containers"]


def asks_for_gpu(container: Mapping[str, Any], gpu_resources: tuple[str, ...]) -> bool:
    """True if the container requests or limits a GPU resource, or holds a DRA claim."""
    res = container.get("resources")
    if not isinstance(res, Mapping):
        return False
    if res.get("claims"):
        return True
    for section in ("limits", "requests"):
        amounts = res.get(section)
        if isinstance(amounts, Mapping) and any(str(k).startswith(gpu_resources) for k in amounts):
            return True
    return False


def path_of(index: int) -> tuple[str, str, int]:
    return ("spec", "containers", index)


def _ensure_volume(b: PatchBuilder, spec: Mapping[str, Any], name: str, make: Callable[[], Json]) -> None:
    volumes = _list(spec.get("volumes"))
    if not any(isinstance(v, Mapping) and v.get("name") == name for v in volumes or []):
        b.append(pointer("spec", "volumes"), volumes, make())


def _ensure_sidecar(
    b: PatchBuilder, pod: Mapping[str, Any], spec: Mapping[str, Any], settings: InjectionSettings, opts: PodOptions
) -> list[str]:
    if _named(spec, SIDECAR_NAME):
        return []
    token = token_mount(spec)
    sidecar = sidecar_container(settings, opts, controller_owner(pod), token)
    if opts.native_sidecar:
        _append_init_container(b, spec, sidecar)
    else:
        b.append(pointer("spec", "containers"), _list(spec.get("containers")), sidecar)
    if token is None and opts.events:
        return ["oomsight: the pod mounts no service account token; the sidecar cannot post OOM Events"]
    return []


def _ensure_spool_access(b: PatchBuilder, index: int, container: Mapping[str, Any], opts: PodOptions) -> None:
    base = path_of(index)
    mounts = _list(container.get("volumeMounts"))
    taken = _strings(mounts, "name") | _strings(mounts, "mountPath")
    if SPOOL_VOLUME not in taken and SPOOL_PATH not in taken:
        b.append(pointer(*base, "volumeMounts"), mounts, {"name": SPOOL_VOLUME, "mountPath": SPOOL_PATH})
    env = _list(container.get("env"))
    present = _strings(env, "name")
    wanted = {ENV_DIR: SPOOL_PATH}
    if opts.profile_every_seconds is not None:  # oomsight.io/profile-every-seconds
        wanted[ENV_PROFILE_EVERY] = str(opts.profile_every_seconds)
    if opts.profile_steps is not None:
        wanted[ENV_PROFILE_STEPS] = str(opts.profile_steps)
    if opts.artifacts_max_bytes is not None:  # room kept for events in the spool (docs/kubernetes.md)
        wanted[ENV_ARTIFACTS_MAX_BYTES] = str(opts.artifacts_max_bytes)
    for name, value in wanted.items():
        if name not in present:  # the container's own setting wins
            b.append(pointer(*base, "env"), env, {"name": name, "value": value})
    message_path = container.get("terminationMessagePath")
    custom = isinstance(message_path, str) and message_path != DEFAULT_TERMINATION_MESSAGE_PATH
    if custom and ENV_TERMINATION_MESSAGE_PATH not in present:  # the hook writes a fatal OOM's diagnosis there
        b.append(pointer(*base, "env"), env, {"name": ENV_TERMINATION_MESSAGE_PATH, "value": message_path})


def _ensure_prediction(b: PatchBuilder, index: int, container: Mapping[str, Any], opts: PodOptions) -> list[str]:
    """``OOMSIGHT_PREDICTION`` from the pod's predicted-peak annotation (the downward API), unless the
    container sets the variable itself, or may through ``envFrom``, whose contents the webhook cannot see."""
    if not opts.predicted_peak:
        return []
    env = _list(container.get("env"))
    if ENV_PREDICTION in _strings(env, "name"):
        return []  # the container's own prediction wins
    if container.get("envFrom"):
        name = str(container.get("name"))[:40]
        return [
            f"oomsight: {ANN_PREDICTED_PEAK} not handed to container {name!r}: its envFrom may set {ENV_PREDICTION}; "
            f"set it in its env (docs/prediction.md)"
        ]
    field = f"metadata.annotations['{ANN_PREDICTED_PEAK}']"
    b.append(pointer(*path_of(index), "env"), env, field_env(ENV_PREDICTION, field))
    return []


def _ensure_zero_code(
    b: PatchBuilder, spec: Mapping[str, Any], settings: InjectionSettings, targets: list[int]
) -> list[str]:
    """The startup volume and init container, and ``PYTHONPATH`` first in every target container."""
    warnings: list[str] = []
    _ensure_volume(b, spec, STARTUP_VOLUME, startup_volume)
    if not _named(spec, STARTUP_NAME):
        _append_init_container(b, spec, startup_container(settings), before=SIDECAR_NAME)
    containers = spec["containers"]
    for i in targets:
        c = containers[i]
        if not _prepend_pythonpath(b, i, c):
            warnings.append(f"oomsight: container {c.get('name')!r} sets PYTHONPATH via valueFrom; zero-code skipped")
            continue
        mounts = _list(c.get("volumeMounts"))
        if not any(isinstance(m, Mapping) and m.get("name") == STARTUP_VOLUME for m in mounts or []):
            mount = {"name": STARTUP_VOLUME, "mountPath": STARTUP_PATH, "readOnly": True}
            b.append(pointer(*path_of(i), "volumeMounts"), mounts, mount)
    return warnings


def _prepend_pythonpath(b: PatchBuilder, index: int, container: Mapping[str, Any]) -> bool:
    """Put the startup folder first on ``PYTHONPATH``, keeping the user's entries; False if impossible."""
    env = _list(container.get("env"))
    hits = [j for j, e in enumerate(env or []) if isinstance(e, Mapping) and e.get("name") == "PYTHONPATH"]
    path = pointer(*path_of(index), "env")
    if not hits:
        # a PYTHONPATH from envFrom is kept by referencing it; an undefined $(VAR) stays literal and harmless
        value = STARTUP_PATH + (":$(PYTHONPATH)" if container.get("envFrom") else "")
        b.append(path, env, {"name": "PYTHONPATH", "value": value})
        return True
    j = hits[-1]  # the last definition wins in Kubernetes
    entry = env[j]  # type: ignore[index]
    if "valueFrom" in entry and "value" not in entry:
        return False
    current = str(entry.get("value") or "")
    if current.split(":")[0] != STARTUP_PATH:
        b.set(pointer(*path_of(index), "env", j, "value"), STARTUP_PATH + (":" + current if current else ""))
    return True


def _ensure_annotations(
    b: PatchBuilder, annotations: Optional[Mapping[str, Any]], settings: InjectionSettings, opts: PodOptions
) -> list[str]:
    """``prometheus.io/*`` scrape annotations, unless the pod announces its own metrics."""
    if not settings.scrape_annotations:
        return []
    current = annotations or {}
    port = str(opts.metrics_port)
    wanted = {"prometheus.io/scrape": "true", "prometheus.io/port": port, "prometheus.io/path": "/metrics"}
    if all(current.get(k) == v for k, v in wanted.items()):
        return []
    if any(k in current for k in wanted):
        return ["oomsight: the pod has its own prometheus.io annotations; scrape oomsight with the PodMonitor"]
    for key, value in wanted.items():
        b.put(pointer("metadata", "annotations"), annotations, key, value)
    return []


def _append_init_container(b: PatchBuilder, spec: Mapping[str, Any], container: Json, before: str = "") -> None:
    """Append to ``initContainers``; with ``before``, insert ahead of that container if it is there."""
    inits = _list(spec.get("initContainers"))
    names = [c.get("name") for c in inits or [] if isinstance(c, Mapping)]
    if before and before in names:
        b.ops.append({"op": "add", "path": pointer("spec", "initContainers", names.index(before)), "value": container})
        return
    b.append(pointer("spec", "initContainers"), inits, container)


def _named(spec: Mapping[str, Any], name: str) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("name") == name
        for key in ("containers", "initContainers")
        for c in _list(spec.get(key)) or []
    )


def _list(value: Any) -> Optional[list[Any]]:
    return value if isinstance(value, list) else None


def _strings(items: Optional[list[Any]], key: str) -> set[str]:
    """The string values of ``key`` in the maps of ``items`` (a name that is a map is no name)."""
    return {v for v in (i.get(key) for i in items or [] if isinstance(i, Mapping)) if isinstance(v, str)}
