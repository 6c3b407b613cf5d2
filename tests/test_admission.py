"""The AdmissionReview parser and answers: bad bodies get a clear 4xx, good ones are always
answered allowed; property-based over arbitrary bytes, JSON and objects."""

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomsight_webhook.admission import Admitter, BadRequest, ReviewLimits, parse_review
from oomsight_webhook.injection import InjectionSettings

from kubetools import apply, fixture, validate

LIMIT = 4 * 1024 * 1024
JSON = "application/json"


def admitter():
    return Admitter(InjectionSettings(image="ghcr.io/oomsight/oomsight:0.1.0"), ReviewLimits(max_body_bytes=LIMIT))


def review(obj, operation="CREATE", kind="Pod", resource="pods", api_version="admission.k8s.io/v1", **extra):
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": resource},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": resource},
        "namespace": "team-a",
        "operation": operation,
        "userInfo": {
            "username": "system:serviceaccount:kubeflow:training-operator",
            "groups": ["system:authenticated"],
        },
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        **extra,
    }
    return json.dumps({"apiVersion": api_version, "kind": "AdmissionReview", "request": request}).encode()


def answer_of(result):
    assert result.status == 200 and result.content_type == JSON
    doc = json.loads(result.body)
    assert doc["kind"] == "AdmissionReview" and doc["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert doc["response"]["allowed"] is True
    return doc


def test_a_pod_create_is_answered_with_a_base64_json_patch_that_makes_a_valid_pod():
    a = admitter()
    pod = fixture("pytorchjob-worker.yaml")
    doc = answer_of(a.admit(review(pod), JSON))
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["response"]["patchType"] == "JSONPatch"
    patched = apply(pod, json.loads(base64.b64decode(doc["response"]["patch"])))
    validate(patched)
    assert a.counts()["injected"] == 1


def test_the_answer_speaks_the_requests_api_version():
    doc = answer_of(admitter().admit(review(fixture("cpu-pod.yaml"), api_version="admission.k8s.io/v1beta1"), JSON))
    assert doc["apiVersion"] == "admission.k8s.io/v1beta1"
    assert doc["response"]["warnings"] == ["oomsight: no container asks for a GPU; the spool goes to all containers"]


@pytest.mark.parametrize(
    "operation, kind, resource, extra",
    [
        ("UPDATE", "Pod", "pods", {}),
        ("CREATE", "Deployment", "deployments", {}),
        ("CREATE", "Pod", "pods", {"subResource": "ephemeralcontainers"}),
        ("DELETE", "Pod", "pods", {}),
    ],
)
def test_anything_but_a_pod_create_is_allowed_unchanged(operation, kind, resource, extra):
    a = admitter()
    doc = answer_of(a.admit(review(fixture("cpu-pod.yaml"), operation, kind, resource, **extra), JSON))
    assert "patch" not in doc["response"] and a.counts()["unchanged"] == 1


def test_an_already_injected_pod_is_allowed_unchanged():
    a = admitter()
    pod = fixture("job-pod.yaml")
    first = answer_of(a.admit(review(pod), JSON))
    injected = apply(pod, json.loads(base64.b64decode(first["response"]["patch"])))
    second = answer_of(a.admit(review(injected), JSON))
    assert "patch" not in second["response"]


def test_a_pod_without_containers_is_allowed_unchanged_with_a_warning():
    doc = answer_of(admitter().admit(review({"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {}}), JSON))
    assert "patch" not in doc["response"] and doc["response"]["warnings"][0].startswith("oomsight:")


@pytest.mark.parametrize(
    "body, content_type, status, words",
    [
        (b"{}", "text/plain", 415, "not application/json"),
        (b"{}", None, 415, "not application/json"),
        (b"x" * (LIMIT + 1), JSON, 413, "over the limit"),
        (b"\xff\xfe{", JSON, 400, "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, JSON, 400, "not JSON"),
        (b'{"kind": "Pod"}', JSON, 400, "not an AdmissionReview"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2"}', JSON, 400, "apiVersion"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}', JSON, 400, "uid"),
    ],
)
def test_bodies_that_are_not_admission_reviews_get_a_clear_client_error(body, content_type, status, words):
    a = admitter()
    result = a.admit(body, content_type)
    assert result.status == status and words in result.body.decode()
    assert a.counts()["rejected"] == 1


def test_a_content_type_with_a_charset_is_accepted():
    answer_of(admitter().admit(review(fixture("cpu-pod.yaml")), "application/json; charset=utf-8"))


def test_a_bug_in_the_mutation_admits_the_pod_unchanged_and_is_counted(monkeypatch):
    import oomsight_webhook.admission as admission

    monkeypatch.setattr(admission, "mutate", lambda pod, s: 1 / 0)
    a = admitter()
    doc = answer_of(a.admit(review(fixture("cpu-pod.yaml")), JSON))
    assert "patch" not in doc["response"] and a.counts()["error"] == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_are_parsed_or_refused_with_bad_request(body):
    try:
        parse_review(body, JSON, LIMIT)
    except BadRequest as exc:
        assert 400 <= exc.status < 500


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_arbitrary_json_documents_are_parsed_or_refused_with_bad_request(doc):
    try:
        parse_review(json.dumps(doc).encode(), JSON, LIMIT)
    except BadRequest as exc:
        assert exc.status == 400


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from(["CREATE", "UPDATE", 7, None]))
def test_a_review_with_any_object_is_answered_allowed_without_an_internal_error(obj, operation):
    a = admitter()
    answer_of(a.admit(review(obj, operation=operation), JSON))
    assert a.counts()["error"] == 0


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["uid", "kind", "resource", "operation", "object", "subResource"]), json_values))
def test_requests_with_any_fields_never_crash_the_admitter(request):
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()
    result = admitter().admit(body, JSON)
    assert result.status in (200, 400)
