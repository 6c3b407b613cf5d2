"""The objects the webhook adds to a pod: the sidecar, the zero-code init container, volumes.

Every injected container meets Pod Security "restricted": non-root with a fixed UID,
read-only root filesystem, no privilege escalation, all capabilities dropped, the
runtime's default seccomp profile.
"""

from __future__ import annotations

from typing import Any, Optional

from oomsight.config import ENV_DIR
from oomsight.config.table import variables
from oomsight.config.variables import ADMIN_PORT_AUTO, DEFAULT_ADMIN_PORT, SIDECAR
from oomsight_server.owner import Owner, owner_env
from oomsight_webhook.injection import InjectionSettings, PodOptions

# The sidecar's variables that the webhook writes into the pods it patches, as its table names them.
_SIDECAR_ENV = variables(SIDECAR)
ENV_PORT = _SIDECAR_ENV["sidecar_port"]
ENV_HOST = _SIDECAR_ENV["sidecar_host"]
ENV_DRAIN = _SIDECAR_ENV["drain_seconds"]
ENV_ADMIN_PORT = _SIDECAR_ENV["admin_port"]
ENV_ADMIN_TOKEN_FILE = _SIDECAR_ENV["admin_token_file"]
ENV_ADMIN_REQUIRE_TOKEN = _SIDECAR_ENV["admin_require_token"]
ENV_POD_NAME = _SIDECAR_ENV["pod_name"]
ENV_POD_NAMESPACE = _SIDECAR_ENV["pod_namespace"]
ENV_POD_UID = _SIDECAR_ENV["pod_uid"]
ENV_EVENTS = _SIDECAR_ENV["events"]
ENV_RESOURCE_CLAIMS = _SIDECAR_ENV["resource_claims"]

SIDECAR_NAME = "oomsight-sidecar"
STARTUP_NAME = "oomsight-startup"
SPOOL_VOLUME = "oomsight-spool"
STARTUP_VOLUME = "oomsight-startup"
SPOOL_PATH = "/var/run/oomsight"
STARTUP_PATH = "/var/run/oomsight-startup"
STARTUP_SIZE_LIMIT = "32Mi"
METRICS_PORT_NAME = "metrics"
ALL_INTERFACES = "0.0.0.0"
"""The injected sidecar's listen address, given explicitly: ``oomsight sidecar`` alone listens on
127.0.0.1, and Prometheus must reach the pod IP."""
ADMIN_TOKEN_FILE = SPOOL_PATH + "/.admin-token"
"""In ``hostNetwork`` pods the sidecar writes its admin token here (0600, its own UID)."""
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Kubernetes mounts the service account token; the sidecar needs it to post Events."""

Json = dict[str, Any]


def security_context(uid: int) -> Json:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def field_env(name: str, field_path: str) -> Json:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def sidecar_container(
    settings: InjectionSettings, opts: PodOptions, owner: Optional[Owner], token_mount: Optional[Json]
) -> Json:
    """The metrics sidecar; a native sidecar when ``opts.native_sidecar``.

    ``token_mount`` is the pod's service account token mount, copied from another container:
    the API server's ServiceAccount admission adds it to the containers that exist before
    mutating webhooks run, so a container added by a webhook would not get it otherwise."""
    env = [
        {"name": ENV_DIR, "value": SPOOL_PATH},
        {"name": ENV_PORT, "value": str(opts.metrics_port)},
        {"name": ENV_HOST, "value": ALL_INTERFACES},
        field_env(ENV_POD_NAME, "metadata.name"),
        field_env(ENV_POD_NAMESPACE, "metadata.namespace"),
        field_env(ENV_POD_UID, "metadata.uid"),
        *owner_env(owner),
        {"name": ENV_EVENTS, "value": "1" if opts.events else "0"},
    ]
    if settings.resource_claims:  # only then: pods of a chart without the option stay as they were
        env.append({"name": ENV_RESOURCE_CLAIMS, "value": "1"})
    if settings.drain_seconds:
        env.append({"name": ENV_DRAIN, "value": f"{settings.drain_seconds:g}"})
    env += admin_env(opts)
    container: Json = {
        "name": SIDECAR_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["oomsight", "sidecar"],
        "env": env,
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": opts.metrics_port, "protocol": "TCP"}],
        "resources": opts.resources.as_spec(),
        "securityContext": security_context(settings.run_as_user),
        "volumeMounts": [{"name": SPOOL_VOLUME, "mountPath": SPOOL_PATH}, *([token_mount] if token_mount else [])],
        "readinessProbe": _probe("/readyz", period_seconds=10),
        "livenessProbe": _probe("/healthz", period_seconds=20),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if opts.native_sidecar:
        container["restartPolicy"] = "Always"
    return container


def admin_env(opts: PodOptions) -> list[Json]:
    """The admin endpoint's port when it is not the default; a token in ``hostNetwork`` pods."""
    if opts.host_network:
        return [
            {"name": ENV_ADMIN_PORT, "value": ADMIN_PORT_AUTO},
            {"name": ENV_ADMIN_REQUIRE_TOKEN, "value": "1"},
            {"name": ENV_ADMIN_TOKEN_FILE, "value": ADMIN_TOKEN_FILE},
        ]
    if opts.admin_port != DEFAULT_ADMIN_PORT:
        value = ADMIN_PORT_AUTO if opts.admin_port is None else str(opts.admin_port)
        return [{"name": ENV_ADMIN_PORT, "value": value}]
    return []


def token_mount(spec: Any) -> Optional[Json]:
    """The service account token mount of any container of the pod (read-only), if one has it."""
    for key in ("containers", "initContainers"):
        for container in _items(spec.get(key)):
            for mount in _items(container.get("volumeMounts") if isinstance(container, dict) else None):
                if isinstance(mount, dict) and mount.get("mountPath") == TOKEN_PATH and mount.get("name"):
                    return {"name": mount["name"], "mountPath": TOKEN_PATH, "readOnly": True}
    return None


def _items(value: Any) -> list[Any]:
    """``value`` if it is a list, else none: a pod's field of another type holds nothing to read."""
    return value if isinstance(value, list) else []


def startup_container(settings: InjectionSettings) -> Json:
    """The zero-code init container: copies the dependency-free hook into a shared volume."""
    return {
        "name": STARTUP_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["oomsight", "install-startup", STARTUP_PATH],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": security_context(settings.run_as_user),
        "volumeMounts": [{"name": STARTUP_VOLUME, "mountPath": STARTUP_PATH}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def spool_volume(opts: PodOptions) -> Json:
    return {"name": SPOOL_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": opts.spool_size_limit}}


def startup_volume() -> Json:
    return {"name": STARTUP_VOLUME, "emptyDir": {"sizeLimit": STARTUP_SIZE_LIMIT}}


def _probe(path: str, period_seconds: int) -> Json:
    return {
        "httpGet": {"path": path, "port": METRICS_PORT_NAME},
        "periodSeconds": period_seconds,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }
