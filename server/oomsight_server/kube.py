"""Every call oomsight makes to the Kubernetes API server, behind one small interface.

The sidecar posts Events and, where asked to, lists its namespace's ResourceClaims a page at a
time (``oomsight_sidecar.claims``: ``limit`` and ``continue``, a byte bound per page, only the
fields it reads kept); the webhook keeps its TLS Secret and the ``caBundle`` of its
own MutatingWebhookConfiguration and asks for the server version. Nothing else. The
chart's RBAC grants exactly these calls (``docs/kubernetes.md``, "RBAC"), and the
tests check that against the rendered chart.

:class:`KubeApi` is what the rest of the code sees; :class:`KubeClient` implements it
with the official ``kubernetes`` client (imported lazily: the base install does not
have it, and it costs 42 MiB: ``kubernetes/__init__.py`` imports every API and model, whichever submodule is
named, so nothing lighter is in reach; it is imported only once a service account token is there, issue 49).
Results are plain dicts in the API's JSON shape; failures are
:class:`KubeError` with the HTTP status (0 when the server was not reached).
"""

from __future__ import annotations

import json
import os
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


class PageTooLarge(KubeError):
    """A page of a listing was longer than the bytes allowed: ask again for fewer items."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(0, f"a page longer than {max_bytes} bytes")
        self.max_bytes = max_bytes


CLAIM_KEYS = frozenset(
    {
        # the listing: its items and where the next page starts
        "items",
        "metadata",
        "continue",
        # a claim: its name, who it is reserved for, what was allocated (oomsight_sidecar.claims)
        "name",
        "status",
        "reservedFor",
        "resource",
        "uid",
        "allocation",
        "devices",
        "results",
        "request",
        "driver",
        "pool",
        "device",
        "consumedCapacity",
        "memory",
    }
)
"""The keys of a ResourceClaim listing the sidecar reads; every other key (annotations, labels,
managed fields, the spec) is dropped while the page is parsed, at any depth."""


SERVICE_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
"""Where Kubernetes mounts the pod's service account token, and where ``kubernetes.config.load_incluster_config``
reads it (its ``SERVICE_TOKEN_FILENAME``): absent where the pod has ``automountServiceAccountToken: false``."""


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
        """Use the pod's service account token; raises if not running in a pod. Without a token it raises before
        the kubernetes package is imported: a failed attempt would keep its 42 MiB for the process's life."""
        if not os.path.isfile(SERVICE_TOKEN_FILE):
            raise RuntimeError(f"no service account token at {SERVICE_TOKEN_FILE} (automountServiceAccountToken off?)")
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

    def list_resource_claims_page(self, namespace: str, limit: int, continue_token: str, max_bytes: int) -> Json:
        """One page of the namespace's ResourceClaims: at most ``limit`` claims from ``continue_token``
        (empty: the first page), read only up to ``max_bytes`` (:class:`PageTooLarge` past them), with
        only :data:`CLAIM_KEYS` kept. The next page's token is ``metadata.continue``."""
        paging: dict[str, Any] = {"limit": limit}
        if continue_token:
            paging["_continue"] = continue_token
        resp = self._request(self._resource.list_namespaced_resource_claim, namespace, **paging)
        data = b""
        try:
            data = resp.read(max_bytes + 1)
        except Exception as exc:  # the connection broke mid-answer
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
        finally:
            if len(data) > max_bytes or not data:  # the rest of a long answer is never read: the connection goes
                resp.close()
            resp.release_conn()  # a page read whole: the connection serves the next page
        if len(data) > max_bytes:
            raise PageTooLarge(max_bytes)
        return _json_map(data, lambda pairs: {key: value for key, value in pairs if key in CLAIM_KEYS})

    def _request(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The answer of ``method``, its body not yet read; an error status or no answer as :class:`KubeError`."""
        from kubernetes.client.exceptions import ApiException

        try:
            return method(*args, **kwargs, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), _status_message(exc.body) or str(exc.reason)) from None
        except Exception as exc:  # urllib3 / socket errors: the server was not reached
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None

    def _call(self, method: Callable[..., Any], *args: Any) -> Json:
        resp = self._request(method, *args)
        try:
            data = resp.data
        except Exception as exc:  # the connection broke mid-answer
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from None
        return _json_map(data)


def _json_map(data: Optional[bytes], pairs_hook: Optional[Callable[[list[tuple[str, Any]]], Any]] = None) -> Json:
    """The JSON object of an answer (``{}`` when it is another JSON value); :class:`KubeError` if not JSON."""
    try:
        doc = json.loads(data or b"{}", object_pairs_hook=pairs_hook)
    except ValueError as exc:  # UnicodeDecodeError included
        raise KubeError(0, f"answer is not JSON ({exc})") from None
    except RecursionError:
        raise KubeError(0, "answer is not JSON (nested too deeply)") from None
    return doc if isinstance(doc, dict) else {}


def _status_message(body: Any) -> str:
    """The ``message`` of a ``Status`` object in an error body, if there is one."""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return ""
    return str(doc.get("message", "")) if isinstance(doc, dict) else ""
