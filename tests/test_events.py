"""Kubernetes Events on OOM: the body is a valid events.k8s.io/v1 Event, each OOM is posted
once (also across a sidecar restart), failures are counted and logged once, SIGTERM flushes."""

import json
import logging
import os
import threading
from datetime import datetime

from prometheus_client import CollectorRegistry

from oomsight.wire.spool import SpoolReader
from oomsight_server.kube import KubeError
from oomsight_server.owner import controller_owner, pod_owner
from oomsight_sidecar.events import NOTE_MAX_BYTES, EventPoster, event_body, oom_id
from oomsight_sidecar.kubemetrics import KubernetesCollector
from oomsight_sidecar.main import run
from oomsight_sidecar.settings import KubernetesSettings, SidecarSettings

from fakes import GIB
from kubetools import FakeKube, fixture, kube_stub, validate
from procs import free_port
from spoolmaker import hooked_process

POD = KubernetesSettings(
    pod_name="llama-ft-worker-1",
    pod_namespace="team-a",
    pod_uid="4f6f2f0e-5a6b-4b7c-8d9e-0a1b2c3d4e5f",
    owner_kind="PyTorchJob",
    owner_name="llama-ft",
)


def spool_with_ooms(spool, monkeypatch, n=1):
    hook, cuda = hooked_process(spool, monkeypatch=monkeypatch)
    for _ in range(n):
        cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    return hook, cuda


def poster_for(spool, kube, pod=POD):
    return EventPoster(spool, pod, lambda: kube)


def test_the_event_is_a_valid_events_k8s_io_v1_event_about_the_pod(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    kube = FakeKube()
    assert poster_for(spool, kube).tick() == 1
    (body,) = kube.events
    validate(body)
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": POD.pod_name,
        "namespace": "team-a",
        "uid": POD.pod_uid,
    }
    assert (body["type"], body["reason"], body["action"]) == ("Warning", "CUDAOutOfMemory", "Allocate")
    assert body["reportingController"] == "oomsight.io/sidecar" and body["reportingInstance"] == POD.pod_name
    assert body["eventTime"].endswith("Z") and len(body["eventTime"]) == len("2025-01-01T00:00:00.000000Z")
    assert "100.00 GiB allocation failed" in body["note"] and "oversized_request" in body["note"]
    assert len(body["note"].encode()) <= NOTE_MAX_BYTES and "\n" not in body["note"]


def test_a_long_diagnosis_is_cut_to_the_api_servers_note_limit(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    (oom,) = SpoolReader(spool).read().events
    oom["diagnosis"]["summary"] = "ü" * 2000
    body = event_body(oom, POD)
    assert len(body["note"].encode()) <= NOTE_MAX_BYTES and body["note"].endswith("...")
    validate(body)


def test_each_oom_is_posted_once_even_across_a_sidecar_restart(spool, monkeypatch):
    _, cuda = spool_with_ooms(spool, monkeypatch, n=2)
    kube = FakeKube()
    first = poster_for(spool, kube)
    assert first.tick() == 2 and first.tick() == 0
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
    restarted = poster_for(spool, kube)  # a new process reading the same emptyDir
    assert restarted.tick() == 1
    assert len(kube.events) == 3 and len({e["metadata"]["name"] for e in kube.events}) == 3
    assert restarted.counts()[0]["posted"] == 1


def test_a_lost_state_file_posts_nothing_twice_thanks_to_stable_event_names(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    kube = FakeKube()
    poster_for(spool, kube).tick()
    os.remove(os.path.join(spool, "sidecar", "events-posted.json"))
    again = poster_for(spool, kube)
    assert again.tick() == 0
    assert len(kube.events) == 1 and again.counts()[0]["posted"] == 1  # the 409 meant: already there


def test_a_missing_rbac_grant_is_logged_once_counted_and_the_sidecar_carries_on(spool, monkeypatch, caplog):
    _, cuda = spool_with_ooms(spool, monkeypatch, n=2)
    kube = FakeKube()
    forbidden = KubeError(403, 'events.events.k8s.io is forbidden: User "system:serviceaccount:team-a:default"')
    kube.fail["create_event"] = [forbidden, forbidden, forbidden]
    poster = poster_for(spool, kube)
    with caplog.at_level(logging.WARNING):
        assert poster.tick() == 0
        cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)
        assert poster.tick() == 0
    results, errors = poster.counts()
    assert results == {"posted": 0, "failed": 3, "suppressed": 0}
    assert errors["events_api"] == 3
    warnings = [r.getMessage() for r in caplog.records if "not allowed to create Events" in r.getMessage()]
    assert len(warnings) == 1 and "rbac.podNamespaces={team-a}" in warnings[0]
    assert poster.tick() == 0 and len(kube.calls) == 3  # failed OOMs are not retried forever


def test_an_api_server_hiccup_is_retried_on_the_next_tick(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    kube = FakeKube()
    kube.fail["create_event"] = [KubeError(503, "etcd leader changed")]
    poster = poster_for(spool, kube)
    assert poster.tick() == 0 and poster.tick() == 1
    assert poster.counts() == (
        {"posted": 1, "failed": 0, "suppressed": 0},
        {"events_api": 1, "events_state": 0, "events_document": 0, "kubernetes_client": 0},
    )


def test_ooms_beyond_the_limit_are_counted_as_suppressed(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch, n=3)
    kube = FakeKube()
    poster = poster_for(spool, kube, KubernetesSettings(**{**POD.__dict__, "events_max": 2}))
    poster.tick()
    assert len(kube.events) == 2 and poster.counts()[0]["suppressed"] == 1


def test_without_a_kubernetes_api_ooms_are_counted_as_failed_and_logged_once(spool, monkeypatch, caplog):
    spool_with_ooms(spool, monkeypatch, n=2)

    def no_cluster():
        raise RuntimeError("Service host/port is not set.")

    poster = EventPoster(spool, POD, no_cluster)
    with caplog.at_level(logging.WARNING):
        poster.tick()
    assert poster.counts()[0]["failed"] == 2 and poster.counts()[1]["kubernetes_client"] == 1
    assert sum("cannot reach the Kubernetes API" in r.getMessage() for r in caplog.records) == 1


def test_an_unwritable_state_file_is_counted_and_names_still_protect(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    with open(os.path.join(spool, "sidecar"), "w") as fh:  # a file where the state folder should be
        fh.write("x")
    poster = poster_for(spool, FakeKube())
    assert poster.tick() == 1
    assert poster.counts()[1]["events_state"] == 2  # reading it at start, writing it after the post


def test_sigterm_posts_pending_events_before_the_sidecar_exits(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    kube = FakeKube()
    stop = threading.Event()
    slow = KubernetesSettings(**{**POD.__dict__, "events_interval_seconds": 3600})
    settings = SidecarSettings(spool_dir=spool, host="127.0.0.1", port=free_port())
    done = []
    thread = threading.Thread(target=lambda: done.append(run(settings, stop, slow, lambda: kube)))
    thread.start()
    spool_with_ooms(spool, monkeypatch)  # the OOM that killed training, just before SIGTERM
    stop.set()
    thread.join(20)
    assert done == [0] and len(kube.events) == 1


def test_the_collector_exposes_event_results_errors_and_the_owner(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    poster = poster_for(spool, FakeKube())
    poster.tick()
    reg = CollectorRegistry()
    reg.register(KubernetesCollector(poster, pod_owner(POD)))
    assert reg.get_sample_value("oomsight_kubernetes_events_total", {"result": "posted"}) == 1
    assert reg.get_sample_value("oomsight_kubernetes_events_total", {"result": "failed"}) == 0
    assert reg.get_sample_value("oomsight_sidecar_errors_total", {"component": "events_api"}) == 0
    owner = {"owner_kind": "PyTorchJob", "owner_name": "llama-ft"}
    assert reg.get_sample_value("oomsight_pod_owner_info", owner) == 1


def test_the_owner_comes_from_the_controller_reference_or_is_the_pod_itself():
    assert controller_owner(fixture("job-pod.yaml")).name == "resnet-finetune"
    assert controller_owner(fixture("cpu-pod.yaml")) is None
    refs = [{"kind": "A", "name": "a"}, {"kind": "B", "name": "b", "controller": True}]
    two = {"metadata": {"ownerReferences": refs}}
    assert controller_owner(two).kind == "B"
    bare = KubernetesSettings(pod_name="eval-cpu", pod_namespace="team-a", pod_uid="u")
    assert pod_owner(bare).kind == "Pod" and pod_owner(bare).name == "eval-cpu"
    assert pod_owner(KubernetesSettings()) is None


def test_the_real_client_sends_exactly_the_validated_body_to_the_events_api(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    with kube_stub() as (client, stub):
        poster = EventPoster(spool, POD, lambda: client)
        assert poster.tick() == 1
    (req,) = stub.requests
    assert (req["method"], req["path"]) == ("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events")
    # kubernetes>=33 sends no Content-Type on create; the API server then reads its first type, JSON
    assert req["content_type"] in ("", "application/json")
    validate(req["body"])  # what went over the wire, not only what the code meant to send
    (oom,) = SpoolReader(spool).read().events
    sent, meant = req["body"], json.loads(json.dumps(event_body(oom, POD)))
    # the client re-serialises eventTime as +00:00 instead of Z: the same RFC 3339 instant
    assert datetime.fromisoformat(sent.pop("eventTime")) == datetime.fromisoformat(meant.pop("eventTime"))
    assert sent == meant
    with open(os.path.join(spool, "sidecar", "events-posted.json")) as fh:
        assert oom_id(oom) in json.load(fh)["done"]


def test_the_real_client_turns_a_forbidden_answer_into_a_counted_failure(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    status = {
        "kind": "Status",
        "status": "Failure",
        "reason": "Forbidden",
        "code": 403,
        "message": 'events.events.k8s.io is forbidden: User "system:serviceaccount:team-a:default" cannot create',
    }
    with kube_stub({("POST", r"/apis/events\.k8s\.io/v1/namespaces/[^/]+/events"): (403, status)}) as (client, _):
        poster = EventPoster(spool, POD, lambda: client)
        poster.tick()
    assert poster.counts()[0]["failed"] == 1


def test_a_corrupt_state_file_is_counted_and_nothing_is_posted_twice(spool, monkeypatch):
    spool_with_ooms(spool, monkeypatch)
    kube = FakeKube()
    poster_for(spool, kube).tick()
    with open(os.path.join(spool, "sidecar", "events-posted.json"), "w") as fh:
        fh.write("{not json")
    again = poster_for(spool, kube)
    assert again.counts()[1]["events_state"] == 1
    assert again.tick() == 0 and len(kube.events) == 1
