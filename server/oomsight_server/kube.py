"""Every call oomsight makes to the Kubernetes API server, behind one small interface.

The sidecar posts Events and, where asked to, lists its namespace's ResourceClaims
(``oomsight_sidecar.claims``); the webhook keeps its TLS Secret and the ``caBundle`` of its
own MutatingWebhookConfiguration and asks for the server version. Nothing else. The
chart's RBAC grants exactly these calls (``docs/kubernetes.md``, "RBAC"), and the
tests check that against the rendered chart.

:class:`KubeApi` is what the rest of the code sees; :class:`KubeClient` implements it
with the official ``kubernetes`` client (imported lazily: the base install does not
have it). Results are plain dicts in the API's JSON shape; failures are
:class:`KubeError` with the HTTP status (0 when the server was not reached).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Protocol

Json = dict[str, Any]


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status, 0 if no answer came."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status or 'no answer'}: {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying later: no answer, throttled, or a server-side error."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class KubeApi(Protocol):
    def create_event(self, namespace: str, body: Json) -> Json: ...

    def read_secret(self, namespace: str, name: str) -> Optional[Json]: ...

    def create_secret(self, namespace: str, body: Json) -> Json: ...

    def replace_secret(self, namespace: str, name: str, body: Json) -> Json: ...

    def read_webhook_configuration(self, name: str) -> Json: ...

    def patch_webhook_configuration(self, name: str, patch: list[Json]) -> Json: ...

    def server_version(self) -> str: ...

    def list_resource_claims(self, namespace: str) -> Json: ...


class KubeClient:
    """:class:`KubeApi` over ``kubernetes.client``; build with :meth:`in_cluster`."""

    def __init__(self, api_client: Any, timeout_seconds: float = 5.0) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._events = client.EventsV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)
        self._version = client.VersionApi(api_client)
        self._resource = client.ResourceV1Api(api_client)
        self._timeout = timeout_seconds

    @classmethod
    def in_cluster(cls, timeout_seconds: float = 5.0) -> KubeClient:
        """Use the pod's service account token; raises if not running in a pod."""
        from kubernetes import client, config

        config.load_incluster_config()  # type: ignore[no-untyped-call,unused-ignore]
        return cls(client.ApiClient(), timeout_seconds)

    def create_event(self, namespace: str, body: Json) -> Json:
        return self._call(self._events.create_namespaced_event, namespace, body)

    def read_secret(self, namespace: str, name: str) -> Optional[Json]:
        try:
            return self._call(self._core.read_namespaced_secret, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create_secret(self, namespace: str, body: Json) -> Json:
        return self._call(self._core.create_namespaced_secret, namespace, body)

    def replace_secret(self, namespace: str, name: str, body: Json) -> Json:
        return self._call(self._core.replace_namespaced_secret, name, namespace, body)

    def read_webhook_configuration(self, name: str) -> Json:
        return self._call(self._admission.read_mutating_webhook_configuration, name)

    def patch_webhook_configuration(self, name: str, patch: list[Json]) -> Json:
        return self._call(self._admission.patch_mutating_webhook_configuration, name, patch)

    def server_version(self) -> str:
        return str(self._call(self._version.get_code).get("gitVersion", ""))

    def list_resource_claims(self, namespace: str) -> Json:
        return self._call(self._resource.list_namespaced_resource_claim, namespace)

    def _call(self, method: Callable[..., Any], *args: Any) -> Json:
        from kubernetes.client.exceptions import ApiException

        try:
            resp = method(*args, _preload_content=False, _request_timeout=self._timeout)
            data = resp.data
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), _status_message(exc.body) or str(exc.reason)) from None
        except Exception as exc:  # urllib3 / socket errors: the server was not reached
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
        try:
            doc = json.loads(data or b"{}")
        except ValueError as exc:
            raise KubeError(0, f"answer is not JSON ({exc})") from None
        return doc if isinstance(doc, dict) else {}


def _status_message(body: Any) -> str:
    """The ``message`` of a ``Status`` object in an error body, if there is one."""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return ""
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""
