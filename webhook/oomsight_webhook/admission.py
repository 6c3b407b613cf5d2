"""AdmissionReview in, AdmissionReview out: the webhook's request handling without HTTP.

Bodies that are not an AdmissionReview (wrong content type, too large, not JSON, no
``request.uid``) get a 4xx answer with a one-line reason; with ``failurePolicy:
Ignore`` the API server then creates the pod unchanged. A well-formed review is
always answered ``allowed: true``: for anything but a pod CREATE, or a pod the
mutation cannot handle, without a patch. Nothing here raises past :func:`admit`.

Memory is bounded (docs/kubernetes.md, "Webhook limits"): a body over
``max_review_bytes`` is never parsed — only its first 64 KiB are kept, where the API
server writes ``apiVersion`` and ``request.uid``, and it is answered ``allowed`` without
the sidecar and with a warning (fail-open, counted as ``skipped``); so is a pod with
more than ``max_containers`` containers, and a review that waited too long for one of
the ``max_concurrent`` turns to parse and mutate.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
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
RESULTS = ("injected", "unchanged", "skipped", "rejected", "error")
HEAD_BYTES = 64 * 1024
"""Of a body too large to parse, this much is kept to find its ``apiVersion`` and uid."""
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


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
class ReviewLimits:
    """What one admission review may cost; the webhook's settings fill it."""

    max_body_bytes: int = 4 * 1024 * 1024
    """Larger bodies are refused (413) by their Content-Length, unread."""

    max_review_bytes: int = 1024 * 1024
    """Larger bodies are answered ``allowed`` unchanged (``skipped``) without being parsed."""

    max_containers: int = 500
    """Pods with more containers and init containers are admitted unchanged (``skipped``)."""

    max_concurrent: int = 2
    """Reviews parsed and mutated at once (each costs about 8 times its body)."""

    wait_seconds: float = 5.0
    """How long a review waits for a turn before it is admitted unchanged (``skipped``)."""


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str


def _check_media(content_type: Optional[str]) -> None:
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise BadRequest(415, f"content type {content_type!r} is not application/json")


def parse_review(body: bytes, content_type: Optional[str], max_bytes: int) -> AdmissionRequest:
    """Check and read an AdmissionReview body; raise :class:`BadRequest` otherwise."""
    _check_media(content_type)
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


def review_identity(head: bytes) -> Optional[tuple[str, str]]:
    """``(apiVersion, request.uid)`` from the start of an AdmissionReview, without parsing it
    all: a scan of its JSON tokens that stops once both are found (None if they are not)."""
    depth, key, last, in_request = 0, None, None, False
    api_version = uid = None
    for match in _TOKEN.finditer(head):
        token = match.group()
        if token in (b"{", b"["):
            in_request = in_request or (depth == 1 and key == "request" and token == b"{")
            depth, key = depth + 1, None
        elif token in (b"}", b"]"):
            depth -= 1
            in_request = in_request and depth >= 2
        elif token == b":":
            key = last
        elif token == b",":
            key = None
        elif token[:1] == b'"':
            try:
                text = json.loads(token)
            except ValueError:
                return None
            if key is None:
                last = text
                continue
            if depth == 1 and key == "apiVersion":
                api_version = text
            elif depth == 2 and in_request and key == "uid":
                uid = text
            key = None
        if api_version and uid:
            return (api_version, uid) if api_version in API_VERSIONS else None
    return None


def container_count(obj: Any) -> int:
    """Containers and init containers of a pod object (0 for anything else)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return 0
    return sum(len(v) for v in (spec.get("containers"), spec.get("initContainers")) if isinstance(v, list))


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

    def __init__(self, settings: InjectionSettings, limits: Optional[ReviewLimits] = None) -> None:
        self.settings = settings
        self.limits = limits or ReviewLimits()
        self.max_body_bytes = self.limits.max_body_bytes
        self.results: Counter[str] = Counter(dict.fromkeys(RESULTS, 0))
        self._lock = threading.Lock()
        self._turns = threading.BoundedSemaphore(self.limits.max_concurrent)

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

    def admit(self, body: bytes, content_type: Optional[str], length: Optional[int] = None) -> Answer:
        """Answer a review. ``length``: the whole body's size when ``body`` is only its head
        (the server keeps :data:`HEAD_BYTES` of a body over ``max_review_bytes``)."""
        length = len(body) if length is None else length
        try:
            _check_media(content_type)
            if length > self.max_body_bytes:
                raise BadRequest(413, f"body of {length} bytes is over the limit of {self.max_body_bytes}")
            if length > self.limits.max_review_bytes:
                return self._skip(body, f"the admission review ({length} bytes) is over the webhook's limit")
            if not self._turns.acquire(timeout=self.limits.wait_seconds):
                return self._skip(body, "the webhook was too busy")
            try:
                return self._answer(parse_review(body, content_type, self.max_body_bytes))
            finally:
                self._turns.release()
        except BadRequest as exc:
            return self._reject(exc)

    def _answer(self, req: AdmissionRequest) -> Answer:
        containers = container_count(req.obj)
        if containers > self.limits.max_containers:
            self._count("skipped")
            reason = f"the pod has {containers} containers, over the webhook's limit of {self.limits.max_containers}"
            logger.warning("oomsight webhook: admitted a pod in %s unchanged: %s", req.namespace, reason)
            return _allowed(req.api_version, req.uid, [f"oomsight: sidecar not injected: {reason}"])
        patch, warnings, result = self._mutation(req)
        self._count(result)
        out = json.dumps(review_response(req, patch, warnings), separators=(",", ":")).encode()
        return Answer(200, out, "application/json")

    def _skip(self, head: bytes, reason: str) -> Answer:
        """Fail open: ``allowed`` without a patch, when the review's identity can be found."""
        identity = review_identity(head[:HEAD_BYTES])
        if identity is None:
            raise BadRequest(
                400, f"{reason}, and its apiVersion and request.uid are not in its first {HEAD_BYTES} bytes"
            )
        self._count("skipped")
        logger.warning("oomsight webhook: admitted a pod unchanged: %s", reason)
        return _allowed(identity[0], identity[1], [f"oomsight: sidecar not injected: {reason}"])

    def _reject(self, exc: BadRequest) -> Answer:
        self._count("rejected")
        logger.warning("oomsight webhook: rejected a request (%d): %s", exc.status, exc)
        return Answer(exc.status, (str(exc) + "\n").encode(), "text/plain; charset=utf-8")

    def _mutation(self, req: AdmissionRequest) -> tuple[list[dict[str, Any]], list[str], str]:
        if (req.operation, req.kind, req.resource, req.sub_resource) != ("CREATE", "Pod", "pods", ""):
            return [], [], "unchanged"
        try:
            m = mutate(req.obj, self.settings)
        except Exception:  # a bug must not block pod creation: admit unchanged, count, say so
            logger.exception("oomsight webhook: injection failed for a pod in %s; admitted unchanged", req.namespace)
            return [], ["oomsight: internal error, sidecar not injected (see the webhook's log)"], "error"
        return m.patch, m.warnings, "injected" if m.patch else "unchanged"


def _allowed(api_version: str, uid: str, warnings: list[str]) -> Answer:
    req = AdmissionRequest(api_version, uid, "", "", "", "", "", None)
    out = json.dumps(review_response(req, [], warnings), separators=(",", ":")).encode()
    return Answer(200, out, "application/json")


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
