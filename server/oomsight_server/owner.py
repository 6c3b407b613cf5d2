"""The workload a pod belongs to (Job, PyTorchJob, ReplicaSet, ...), so dashboards can group by it.

The webhook reads the pod's controller from ``metadata.ownerReferences`` at admission
time (the Job or training operator sets them when it creates the pod) and hands it to
the sidecar as ``OOMSIGHT_OWNER_KIND`` / ``OOMSIGHT_OWNER_NAME``: no API read and no
RBAC needed at run time. A pod nobody owns is its own workload (``kind="Pod"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from oomsight.config.sidecar import KubernetesFields
from oomsight.config.table import variables
from oomsight.config.variables import SIDECAR

ENV_OWNER_KIND = variables(SIDECAR)["owner_kind"]
ENV_OWNER_NAME = variables(SIDECAR)["owner_name"]


@dataclasses.dataclass(frozen=True)
class Owner:
    kind: str
    name: str


def controller_owner(pod: Mapping[str, Any]) -> Optional[Owner]:
    """The ``controller: true`` owner reference of a pod, else its first owner, else None."""
    meta = pod.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return None
    usable = [r for r in refs if isinstance(r, Mapping) and r.get("kind") and r.get("name")]
    usable.sort(key=lambda r: r.get("controller") is not True)
    if not usable:
        return None
    return Owner(str(usable[0]["kind"]), str(usable[0]["name"]))


def owner_env(owner: Optional[Owner]) -> list[dict[str, str]]:
    """The sidecar's env entries that carry ``owner`` (none when the pod has no owner)."""
    if owner is None:
        return []
    return [{"name": ENV_OWNER_KIND, "value": owner.kind}, {"name": ENV_OWNER_NAME, "value": owner.name}]


def pod_owner(settings: KubernetesFields) -> Optional[Owner]:
    """The owner the webhook recorded, or the pod itself; None outside Kubernetes."""
    if settings.owner_kind and settings.owner_name:
        return Owner(settings.owner_kind, settings.owner_name)
    if settings.pod_name:
        return Owner("Pod", settings.pod_name)
    return None
