"""Kubernetes stand-ins for tests: schema validation, a recording fake API, an HTTP stub.

No API server can run here (docs/testing.md). So:

- ``validate`` checks objects against the Kubernetes OpenAPI schemas (kubernetes-validate);
- ``FakeKube`` implements ``oomsight_server.kube.KubeApi`` in memory (Secrets with
  resourceVersion conflicts, one MutatingWebhookConfiguration, Events) and records calls;
- ``KubeStub`` is a tiny HTTP server that the *real* ``KubeClient`` (the kubernetes
  client library) talks to, recording method, path, content type and body, so tests can
  see the exact requests and check them against the chart's RBAC.
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import jsonpatch
import kubernetes_validate
import yaml

from oomsight_server.kube import KubeError

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "k8s")
VERSIONS = ("1.29.0", "1.33.0")


def fixture(name: str) -> dict[str, Any]:
    with open(os.path.join(FIXTURES, name)) as fh:
        return yaml.safe_load(fh)


def validate(obj: dict[str, Any], versions: tuple[str, ...] = VERSIONS) -> None:
    """Strict schema validation (unknown fields fail) against each Kubernetes version."""
    doc = copy.deepcopy(obj)
    doc.setdefault("metadata", {}).setdefault("name", "generated-name-x1")  # the API server fills generateName
    for version in versions:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            raise AssertionError(f"{doc['kind']} invalid for Kubernetes {version} at {path}: {exc.message}") from None


def apply(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.JsonPatch(patch).apply(obj)


class FakeKube:
    """An in-memory API: ``calls`` lists (method name, args) in order; ``fail`` injects errors."""

    def __init__(self, version: str = "v1.30.4") -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.claims: list[dict[str, Any]] = []
        self.fail: dict[str, list[KubeError]] = {}
        self.version = version
        self._rv = 0

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        errors = self.fail.get(name)
        if errors:
            raise errors.pop(0)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._record("create_event", namespace, body)
        if any(e["metadata"]["name"] == body["metadata"]["name"] for e in self.events):
            raise KubeError(409, "events.events.k8s.io already exists")
        self.events.append(copy.deepcopy(body))
        return body

    def read_secret(self, namespace: str, name: str) -> Optional[dict[str, Any]]:
        self._record("read_secret", namespace, name)
        found = self.secrets.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._record("create_secret", namespace, body)
        key = (namespace, body["metadata"]["name"])
        if key in self.secrets:
            raise KubeError(409, "secrets already exists")
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[key] = stored
        return stored

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._record("replace_secret", namespace, name, body)
        current = self.secrets.get((namespace, name))
        if current is None or body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified")
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = self._next_rv()
        self.secrets[(namespace, name)] = stored
        return stored

    def read_webhook_configuration(self, name: str) -> dict[str, Any]:
        self._record("read_webhook_configuration", name)
        if name not in self.configs:
            raise KubeError(404, f"mutatingwebhookconfigurations {name} not found")
        return copy.deepcopy(self.configs[name])

    def patch_webhook_configuration(self, name: str, patch: list[dict[str, Any]]) -> dict[str, Any]:
        self._record("patch_webhook_configuration", name, patch)
        self.configs[name] = jsonpatch.JsonPatch(patch).apply(self.configs[name])
        return self.configs[name]

    def server_version(self) -> str:
        self._record("server_version")
        return self.version

    def list_resource_claims(self, namespace: str) -> dict[str, Any]:
        self._record("list_resource_claims", namespace)
        items = [c for c in self.claims if c.get("metadata", {}).get("namespace") == namespace]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList", "items": copy.deepcopy(items)}

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


# --- a recording HTTP stand-in for the API server, for the real kubernetes client ---


class _StubHandler(BaseHTTPRequestHandler):
    server: _StubServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append(
            {
                "method": self.command,
                "path": self.path.split("?")[0],
                "content_type": self.headers.get("Content-Type", ""),
                "body": json.loads(body) if body else None,
            }
        )
        status, doc = self.server.respond(self.command, self.path.split("?")[0], body)
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answers: dict[tuple[str, str], tuple[int, Any]]) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.answers = answers
        self.requests: list[dict[str, Any]] = []

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        for (m, pattern), answer in self.answers.items():
            if m == method and re.fullmatch(pattern, path):
                return answer
        if method in ("POST", "PUT", "PATCH"):
            return 201 if method == "POST" else 200, json.loads(body or b"{}")
        return 404, {"kind": "Status", "status": "Failure", "message": f"{path} not found", "code": 404}


@contextmanager
def kube_stub(answers: Optional[dict[tuple[str, str], tuple[int, Any]]] = None) -> Iterator[tuple[Any, _StubServer]]:
    """A real ``KubeClient`` pointed at a recording stub; ``answers`` maps (method, path regex) to replies."""
    from kubernetes import client

    from oomsight_server.kube import KubeClient

    server = _StubServer(answers or {})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield KubeClient(client.ApiClient(config), timeout_seconds=5), server
    finally:
        server.shutdown()
        server.server_close()


def rbac_request(method: str, path: str) -> tuple[str, str, str, str, str]:
    """(verb, apiGroup, resource, namespace, name) that RBAC checks for an API request path."""
    verb_of = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    m = re.fullmatch(r"/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/([^/]+))?/([^/]+)(?:/([^/]+))?", path)
    if not m:
        raise ValueError(f"not a resource path: {path}")
    group, namespace, resource, name = m.groups()
    return verb_of[method], group or "", resource, namespace or "", name or ""


def rbac_allows(rules: list[dict[str, Any]], request: tuple[str, str, str, str, str]) -> bool:
    verb, group, resource, _namespace, name = request
    for rule in rules:
        if (
            group in rule.get("apiGroups", [])
            and resource in rule.get("resources", [])
            and verb in rule.get("verbs", [])
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
        ):
            return True
    return False


def sidecar_and_webhook_collectors() -> list[Any]:
    """The collectors besides the spool collector, with every family present (for the doc test)."""
    import datetime
    import tempfile

    from oomsight.wire.budget import Budget
    from oomsight_server.listener import ServerErrors
    from oomsight_server.owner import Owner
    from oomsight_sidecar.claims import ClaimCollector, ClaimReader
    from oomsight_sidecar.kubemetrics import KubernetesCollector
    from oomsight_sidecar.server import ServerCollector
    from oomsight_webhook.admission import Admitter
    from oomsight_webhook.certs import make_ca, make_serving
    from oomsight_webhook.injection import InjectionSettings
    from oomsight_webhook.main import Reconciler, WebhookCollector
    from oomsight_webhook.tls import FileCertificates, ServerContext

    now = datetime.datetime.now(datetime.timezone.utc)
    context = ServerContext(tempfile.mkdtemp())
    context.loaded = make_serving(make_ca("doc-ca", now), ["localhost"], now)
    reconciler = Reconciler(FileCertificates("tls.crt", "tls.key"), context)
    admitter = Admitter(InjectionSettings(image="x"))
    claims = ClaimReader(FakeKube, "ml", "uid")
    claims._budgets = [Budget("train-gpu", "gpu", "gpu.nvidia.com", "node-1/gpu-0", 16 << 30)]
    return [
        ClaimCollector(claims),
        KubernetesCollector(None, Owner("Job", "train")),
        WebhookCollector(admitter, reconciler, None),
        ServerCollector(ServerErrors()),
    ]
