"""AdmissionReview in, AdmissionReview out: the webhook's request handling without HTTP.

Bodies that are not an AdmissionReview (wrong content type, too large, not JSON, no
``request.uid``) get a 4xx answer with a one-line reason; with ``failurePolicy:
Ignore`` the API server then creates the pod unchanged. A well-formed review is
always answered ``allowed: true``: for anything but a pod CREATE, or a pod the
mutation cannot handle, without a patch. Nothing here raises past :func:`admit`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any, Optional

from oomsight_webhook.injection import InjectionSettings
from oomsight_webhook.mutation import mutate

logger = logging.getLogger(__name__)

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_WARNINGS = 10
WARNING_MAX_CHARS = 240
RESULTS = ("injected", "unchanged", "rejected", "error")


class BadRequest(Exception):
    """The body is not an AdmissionReview we can answer; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class AdmissionRequest:
    api_version: str
    uid: str
    operation: str
    kind: str
    resource: str
    sub_resource: str
    namespace: str
    obj: Any


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str


def parse_review(body: bytes, content_type: Optional[str], max_bytes: int) -> AdmissionRequest:
    """Check and read an AdmissionReview body; raise :class:`BadRequest` otherwise."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise BadRequest(415, f"content type {content_type!r} is not application/json")
    if len(body) > max_bytes:
        raise BadRequest(413, f"body of {len(body)} bytes is over the limit of {max_bytes}")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(400, f"body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview":
        raise BadRequest(400, "body is not an AdmissionReview")
    if doc.get("apiVersion") not in API_VERSIONS:
        raise BadRequest(400, f"apiVersion {str(doc.get('apiVersion'))[:80]!r} is not one of {', '.join(API_VERSIONS)}")
    req = doc.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise BadRequest(400, "AdmissionReview has no request.uid")
    return AdmissionRequest(
        api_version=doc["apiVersion"],
        uid=req["uid"],
        operation=_text(req.get("operation")),
        kind=_text(_get(req.get("kind"), "kind")),
        resource=_text(_get(req.get("resource"), "resource")),
        sub_resource=_text(req.get("subResource")),
        namespace=_text(req.get("namespace")),
        obj=req.get("object"),
    )


def review_response(req: AdmissionRequest, patch: list[dict[str, Any]], warnings: list[str]) -> dict[str, Any]:
    """An ``allowed`` AdmissionReview answer in the request's API version, with ``patch`` if any."""
    response: dict[str, Any] = {"uid": req.uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = [w[:WARNING_MAX_CHARS] for w in warnings[:MAX_WARNINGS]]
    return {"apiVersion": req.api_version, "kind": "AdmissionReview", "response": response}


class Admitter:
    """Answers admission requests and counts them by result (``injected``, ``unchanged``, ...)."""

    def __init__(self, settings: InjectionSettings, max_body_bytes: int) -> None:
        self.settings = settings
        self.max_body_bytes = max_body_bytes
        self.results: Counter[str] = Counter(dict.fromkeys(RESULTS, 0))
        self._lock = threading.Lock()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.results)

    def _count(self, result: str) -> None:
        with self._lock:
            self.results[result] += 1

    def reject_oversized(self, length: int) -> None:
        """Count a body refused by its Content-Length before it was read."""
        self._count("rejected")
        logger.warning("oomsight webhook: rejected a body of %d bytes (limit %d)", length, self.max_body_bytes)

    def admit(self, body: bytes, content_type: Optional[str]) -> Answer:
        try:
            req = parse_review(body, content_type, self.max_body_bytes)
        except BadRequest as exc:
            self._count("rejected")
            logger.warning("oomsight webhook: rejected a request (%d): %s", exc.status, exc)
            return Answer(exc.status, (str(exc) + "\n").encode(), "text/plain; charset=utf-8")
        patch, warnings, result = self._mutation(req)
        self._count(result)
        out = json.dumps(review_response(req, patch, warnings), separators=(",", ":")).encode()
        return Answer(200, out, "application/json")

    def _mutation(self, req: AdmissionRequest) -> tuple[list[dict[str, Any]], list[str], str]:
        if (req.operation, req.kind, req.resource, req.sub_resource) != ("CREATE", "Pod", "pods", ""):
            return [], [], "unchanged"
        try:
            m = mutate(req.obj, self.settings)
        except Exception:  # a bug must not block pod creation: admit unchanged, count, say so
            logger.exception("oomsight webhook: injection failed for a pod in %s; admitted unchanged", req.namespace)
            return [], ["oomsight: internal error, sidecar not injected (see the webhook's log)"], "error"
        return m.patch, m.warnings, "injected" if m.patch else "unchanged"


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
