"""A Kubernetes manifest's pod templates, annotated with a predicted peak (``oomsight predict --annotate``,
issue 51).

The manifest is read before anything is traced, so a wrong file costs no prediction; each of its documents
that is a Pod or a workload has its pod template found (``TEMPLATES``), and every template gets the
annotations; a document of another kind (a ConfigMap beside the Job) passes through unchanged, and a
manifest with no pod template at all is refused. YAML in, YAML out (PyYAML: its comments are not kept);
a manifest written as JSON comes back as JSON.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

TEMPLATES: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Job": ("spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
"""Kind -> the path to its pod template (the Pod is its own). Kubeflow's training jobs (PyTorchJob,
TFJob, MPIJob, ...) keep one template per replica type under ``spec.<kind>ReplicaSpecs.<type>.template``:
every one of those is annotated too (``REPLICA_SPECS``)."""
REPLICA_SPECS = "ReplicaSpecs"
"""The suffix of Kubeflow's replica-spec maps (``pytorchReplicaSpecs``, ``tfReplicaSpecs``, ``mpiReplicaSpecs``)."""
KINDS_SAID = "a Pod, a Job, a CronJob, a Deployment, a StatefulSet, a DaemonSet, a ReplicaSet or a Kubeflow job"


class ManifestError(ValueError):
    """A manifest that cannot be annotated: the line to print (exit 2)."""


@dataclass(frozen=True)
class Manifest:
    """The documents of one manifest file, as read, and how to write them back."""

    where: str
    """The path as given (``-``: stdin)."""
    documents: tuple[Any, ...]
    as_json: bool
    """The file was JSON: written back as JSON."""


def read(where: str) -> Manifest:
    """The manifest at ``where`` (``-``: stdin), checked to hold at least one pod template."""
    try:
        text = sys.stdin.read() if where == "-" else _text(where)
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"--annotate {where}: cannot be read ({_reason(exc)})") from None
    as_json = text.lstrip().startswith(("{", "["))
    try:
        documents = _parsed(text, as_json)
    except ValueError as exc:
        raise ManifestError(f"--annotate {where}: not {'JSON' if as_json else 'YAML'} ({_reason(exc)})") from None
    found = Manifest(where, tuple(d for d in documents if d is not None), as_json)
    if not any(templates(d) for d in found.documents):
        raise ManifestError(f"--annotate {where}: {_what(found.documents)}, not {KINDS_SAID} with a pod template")
    return found


def annotated(manifest: Manifest, annotations: dict[str, str]) -> str:
    """The manifest's text with ``annotations`` set on every pod template (other annotations kept)."""
    for document in manifest.documents:
        for template in templates(document):
            metadata = template.setdefault("metadata", {}) or {}
            template["metadata"] = metadata
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    if manifest.as_json:
        shown = manifest.documents[0] if len(manifest.documents) == 1 else list(manifest.documents)
        return json.dumps(shown, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump_all(manifest.documents, sort_keys=False, default_flow_style=False))


def templates(document: Any) -> list[dict[str, Any]]:
    """The pod templates of one document: the Pod itself, the template of a workload, each replica type's
    of a Kubeflow job; none for another kind or for what is no Kubernetes object."""
    if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
        return []
    kind, spec = document["kind"], document.get("spec")
    if kind in TEMPLATES:
        found = _at(document, TEMPLATES[kind])
        return [found] if isinstance(found, dict) else []
    if not isinstance(spec, dict):
        return []
    replicas = [v for k, v in spec.items() if k.endswith(REPLICA_SPECS) and isinstance(v, dict)]
    found_all = [r.get("template") for specs in replicas for r in specs.values() if isinstance(r, dict)]
    return [t for t in found_all if isinstance(t, dict)]


def _at(document: dict[str, Any], path: tuple[str, ...]) -> Any:
    found: Any = document
    for key in path:
        found = found.get(key) if isinstance(found, dict) else None
    return found


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _parsed(text: str, as_json: bool) -> list[Any]:
    """The documents of the text; ``ValueError`` where it is not JSON or YAML."""
    if as_json:
        found = json.loads(text)
        return list(found) if isinstance(found, list) else [found]
    import yaml

    load: Callable[[str], Any] = yaml.safe_load_all
    try:
        return list(load(text))
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def _what(documents: tuple[Any, ...]) -> str:
    """``a Service``, ``a Service and a ConfigMap``, ``no Kubernetes object``: what the manifest holds."""
    kinds = [d["kind"] for d in documents if isinstance(d, dict) and isinstance(d.get("kind"), str)]
    if not kinds:
        return "no Kubernetes object (no kind)"
    return " and ".join(f"a {k}" for k in dict.fromkeys(kinds))


def _reason(exc: BaseException) -> str:
    """The first line of an error, without the path it repeats."""
    text = getattr(exc, "strerror", None) or str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
