"""The GPU memory budget of a pod's DRA ResourceClaims (issue 29): claims built with the kubernetes
client's own ``resource.k8s.io/v1`` models (as Kubernetes 1.35/1.36 serve them), served by a
recording stub to the real ``KubeClient``, read by the sidecar's reader and exposed by its collector."""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, generate_latest

from oomsight_server.kube import KubeError
from oomsight_sidecar import main as sidecar_main
from oomsight_sidecar.claims import ClaimCollector, ClaimReader, claim_budgets, parse_memory, start_refresh
from oomsight_sidecar.settings import KubernetesSettings, SidecarSettings

from kubetools import FakeKube, kube_stub, rbac_request

POD_UID = "5a1d7c1e-0000-4000-8000-000000000001"
CLAIMS_PATH = r"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims"


def claim(
    name: str, pod_uid: str, memory: Optional[str] = "16Gi", device: str = "gpu-0", share: Optional[str] = None
) -> dict[str, Any]:
    """A ResourceClaim as the API server serves it once the scheduler allocated it for a pod."""
    capacity = {"memory": memory} if memory is not None else None
    obj = k8s.ResourceV1ResourceClaim(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaim",
        metadata=k8s.V1ObjectMeta(name=name, namespace="ml", uid=f"claim-{name}"),
        spec=k8s.V1ResourceClaimSpec(
            devices=k8s.V1DeviceClaim(
                requests=[
                    k8s.V1DeviceRequest(
                        name="gpu",
                        exactly=k8s.V1ExactDeviceRequest(
                            device_class_name="gpu.nvidia.com",
                            capacity=k8s.V1CapacityRequirements(requests=capacity) if capacity else None,
                        ),
                    )
                ]
            )
        ),
        status=k8s.V1ResourceClaimStatus(
            allocation=k8s.V1AllocationResult(
                devices=k8s.V1DeviceAllocationResult(
                    results=[
                        k8s.V1DeviceRequestAllocationResult(
                            request="gpu",
                            driver="gpu.nvidia.com",
                            pool="node-1",
                            device=device,
                            share_id=share,
                            consumed_capacity=capacity,
                        )
                    ]
                )
            ),
            reserved_for=[k8s.V1ResourceClaimConsumerReference(resource="pods", name="train-0", uid=pod_uid)],
        ),
    )
    return k8s.ApiClient().sanitize_for_serialization(obj)  # type: ignore[no-any-return]


def listing(*claims: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList", "metadata": {}, "items": list(claims)}


def exposition(reader: ClaimReader) -> str:
    registry = CollectorRegistry()
    registry.register(ClaimCollector(reader))
    return generate_latest(registry).decode()


def test_the_claim_objects_have_the_fields_the_1_35_api_serves() -> None:
    doc = claim("train-gpu", POD_UID, share="5a1d7c1e-aaaa-4000-8000-000000000002")
    result = doc["status"]["allocation"]["devices"]["results"][0]
    assert result["consumedCapacity"] == {"memory": "16Gi"} and result["shareID"].startswith("5a1d")
    assert doc["status"]["reservedFor"][0] == {"resource": "pods", "name": "train-0", "uid": POD_UID}


def test_the_budget_of_the_pods_own_claim_is_read_through_the_real_client() -> None:
    answers = {
        ("GET", CLAIMS_PATH): (
            200,
            listing(
                claim("train-gpu", POD_UID, "16Gi", share="s-1"),
                claim("neighbour-gpu", "other-pod-uid", "40Gi", share="s-2"),
                claim("whole-gpu", POD_UID, None, device="gpu-1"),
            ),
        )
    }
    with kube_stub(answers) as (client, server):
        reader = ClaimReader(lambda: client, "ml", POD_UID)
        reader.refresh()
    [budget] = reader.budgets()
    assert (budget.claim, budget.request, budget.driver, budget.dra_device) == (
        "train-gpu",
        "gpu",
        "gpu.nvidia.com",
        "node-1/gpu-0",
    )
    assert budget.memory_bytes == 16 * 2**30
    text = exposition(reader)
    assert (
        'oomsight_gpu_memory_budget_bytes{claim="train-gpu",dra_device="node-1/gpu-0",driver="gpu.nvidia.com",'
        'request="gpu"} 1.7179869184e+10' in text
    )
    assert 'oomsight_resource_claim_reads_total{result="read"} 1.0' in text
    assert [rbac_request(r["method"], r["path"]) for r in server.requests] == [
        ("get", "resource.k8s.io", "resourceclaims", "ml", "")  # a list: RBAC's verb is list (test_chart)
    ]


def test_quantities_are_read_as_kubernetes_writes_them() -> None:
    assert parse_memory("16Gi") == 16 * 2**30
    assert parse_memory("16G") == 16 * 10**9
    assert parse_memory("17179869184") == 17179869184
    assert parse_memory("lots") is None


def test_a_result_with_a_memory_share_that_is_not_a_quantity_is_counted_not_raised() -> None:
    budgets, malformed = claim_budgets(claim("bad", POD_UID, "sixteen gigs"))
    assert budgets == [] and malformed == 1


def test_without_a_claim_there_is_no_budget_series() -> None:
    fake = FakeKube()
    fake.claims = [claim("neighbour-gpu", "other-pod-uid")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    reader.refresh()
    assert reader.budgets() == []
    assert "oomsight_gpu_memory_budget_bytes" not in exposition(reader)


def test_a_refused_listing_is_counted_logged_once_and_keeps_the_last_budgets(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeKube()
    fake.claims = [claim("train-gpu", POD_UID)]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    reader.refresh()
    fake.fail["list_resource_claims"] = [KubeError(403, "forbidden"), KubeError(403, "forbidden")]
    with caplog.at_level(logging.WARNING, logger="oomsight_sidecar.claims"):
        reader.refresh()
        reader.refresh()
    assert [b.claim for b in reader.budgets()] == ["train-gpu"]
    assert reader.counts() == {"read": 1, "failed": 2, "malformed": 0, "truncated": 0}
    assert len([r for r in caplog.records if "rbac.resourceClaims" in r.getMessage()]) == 1


def test_the_sidecar_reads_no_claims_unless_asked_to() -> None:
    fake = FakeKube()
    pod = {"pod_name": "train-0", "pod_namespace": "ml", "pod_uid": POD_UID}
    assert sidecar_main.build_claims(KubernetesSettings(**pod), lambda: fake) is None
    reader = sidecar_main.build_claims(KubernetesSettings(**pod, resource_claims=True), lambda: fake)
    assert reader is not None and reader.namespace == "ml" and reader.pod_uid == POD_UID
    assert fake.calls == []  # nothing is read before the refresh thread starts


def test_the_refresh_thread_reads_at_start_and_stops(tmp_path: Any) -> None:
    fake = FakeKube()
    fake.claims = [claim("train-gpu", POD_UID, "24Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    stop = threading.Event()
    thread = start_refresh(reader, stop, interval_seconds=0.05)
    try:
        for _ in range(100):
            if reader.budgets():
                break
            threading.Event().wait(0.02)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert [b.memory_bytes for b in reader.budgets()] == [24 * 2**30]
    app = sidecar_main.build_app(SidecarSettings(spool_dir=str(tmp_path)), claims=reader)
    assert app is not None


def test_the_webhook_tells_the_sidecar_to_read_claims_only_when_the_chart_grants_it() -> None:
    from oomsight_webhook.injection import InjectionSettings
    from oomsight_webhook.mutation import mutate

    from kubetools import apply, fixture

    def sidecar_env(settings: InjectionSettings) -> dict[str, Any]:
        pod = fixture("job-pod.yaml")
        patched = apply(pod, mutate(pod, settings).patch)
        containers = patched["spec"].get("initContainers", []) + patched["spec"]["containers"]
        (sidecar,) = [c for c in containers if c["name"] == "oomsight-sidecar"]
        return {e["name"]: e.get("value") for e in sidecar["env"]}

    assert "OOMSIGHT_RESOURCE_CLAIMS" not in sidecar_env(InjectionSettings(image="x"))
    on = InjectionSettings.from_env({"OOMSIGHT_INJECT_IMAGE": "x", "OOMSIGHT_INJECT_RESOURCE_CLAIMS": "true"})
    assert sidecar_env(on)["OOMSIGHT_RESOURCE_CLAIMS"] == "1"
    assert KubernetesSettings.from_env({"OOMSIGHT_RESOURCE_CLAIMS": "1"}).resource_claims is True


def test_the_budgets_are_kept_in_the_spool_for_the_report_and_a_broken_file_is_no_budget(tmp_path: Any) -> None:
    from oomsight.wire import budget as budget_doc

    fake = FakeKube()
    fake.claims = [claim("train-gpu", POD_UID, "16Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID, str(tmp_path))
    reader.refresh()
    assert budget_doc.read(str(tmp_path)) == reader.budgets() and reader.budgets()
    fake.claims = []  # the claim went away: the document says so
    reader.refresh()
    assert budget_doc.read(str(tmp_path)) == []
    path = budget_doc.path(str(tmp_path))
    for text in ("{not json", '["a list"]', '{"budgets": [{"claim": "x", "memory_bytes": "16Gi"}, 7]}'):
        with open(path, "w") as fh:
            fh.write(text)
        assert budget_doc.read(str(tmp_path)) == []
    with open(path, "w") as fh:  # a newer writer's keys are accepted
        fh.write('{"version": 2, "budgets": [{"claim": "c", "memory_bytes": 5, "gpu_uuid": "GPU-1"}], "more": 1}')
    assert [(b.claim, b.memory_bytes) for b in budget_doc.read(str(tmp_path))] == [("c", 5)]
    assert budget_doc.read(str(tmp_path / "no-spool")) == []


def test_the_report_sets_the_claimed_share_against_the_peak_and_says_nothing_without_one(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oomsight.analysis.inventory import take_inventory
    from oomsight.tools import report
    from oomsight.wire import budget as budget_doc
    from oomsight.wire.budget import Budget
    from oomsight.wire.spool import SpoolReader

    from spoolmaker import hooked_process

    spool = str(tmp_path)
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)  # peak reserved 5 GiB on its one GPU

    def text() -> str:
        return report.render(take_inventory(SpoolReader(spool).read(), now=hook.sampler.clock()), spool)

    assert "DRA" not in text()
    budget_doc.write(spool, [Budget("train-gpu", "gpu", "gpu.nvidia.com", "node-1/gpu-0", 4 * 2**30)])
    lines = text().splitlines()
    at = lines.index("GPU memory claimed through DRA: train-gpu (node-1/gpu-0) 4.00 GiB")
    assert "of the claimed 4.00 GiB, over the share" in lines[at + 1]
    budget_doc.write(spool, [Budget("train-gpu", "gpu", "gpu.nvidia.com", "node-1/gpu-0", 64 * 2**30)])
    assert "of the claimed 64.00 GiB, within the share" in text()


def test_the_html_report_shows_the_text_reports_claimed_share_and_nothing_without_one(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import html
    import re

    from oomsight.analysis.inventory import take_inventory
    from oomsight.tools import report, report_html
    from oomsight.wire import budget as budget_doc
    from oomsight.wire.budget import Budget
    from oomsight.wire.spool import SpoolReader

    from spoolmaker import hooked_process

    spool = str(tmp_path)
    hook, _ = hooked_process(spool, monkeypatch=monkeypatch)  # peak reserved 5 GiB on its one GPU
    now = hook.sampler.clock()

    def page() -> str:
        return report_html.build(spool, now=now, retention_seconds=3600.0)

    def section(text: str) -> str:
        found = re.search(r'<h2 id="budget">(.*?)</table>', text, flags=re.S)
        return found.group(1) if found else ""

    without = page()
    assert "DRA" not in without and not section(without)
    budget_doc.write(spool, [])  # the claim went away: both reports read as without one
    assert page() == without
    assert "DRA" not in report.render(take_inventory(SpoolReader(spool).read(), now=now), spool)
    budget_doc.write(spool, [Budget("train-<gpu>", "gpu", "gpu.nvidia.com", "node-1/gpu-0", 4 * 2**30)])
    shown = section(page())
    assert "train-<gpu>" not in shown and "train-&lt;gpu&gt; (node-1/gpu-0) 4.00 GiB" in shown  # escaped
    gpu, *cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", shown)]
    assert cells == ["5.00 GiB", "125.0 %", "4.00 GiB", "over the share (memory promised to the GPU's other claims)"]
    text = report.render(take_inventory(SpoolReader(spool).read(), now=now), spool)
    peak, ratio, share, verdict = cells
    assert f"  {gpu}: peak reserved {peak}, {ratio} of the claimed {share}, {verdict}" in text.splitlines()


class PagedKube(FakeKube):
    """A fake API server that lists claims a page at a time, as ``limit``/``continue`` do; ``foreign``
    claims of other pods are made page by page (never all at once) before the stored ones."""

    def __init__(self, foreign: int = 0) -> None:
        super().__init__()
        self.foreign = foreign
        self.pages: list[tuple[int, str, int]] = []
        self._other = claim("neighbour-gpu", "other-pod-uid", "40Gi", share="s-2")

    def list_resource_claims_page(self, namespace: str, limit: int, continue_token: str, max_bytes: int) -> Any:
        self.pages.append((limit, continue_token, max_bytes))
        start = int(continue_token or 0)
        stored = [c for c in self.claims if c.get("metadata", {}).get("namespace") == namespace]
        total = self.foreign + len(stored)
        items = [
            self._other if i < self.foreign else stored[i - self.foreign]
            for i in range(start, min(total, start + limit))
        ]
        more = str(start + limit) if start + limit < total else ""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimList",
            "metadata": {"continue": more},
            "items": items,
        }


def test_claims_are_listed_a_bounded_page_at_a_time_among_50_000_of_other_pods() -> None:
    """Issue 36: 50,000 claims of other pods in one list held 292.9 MiB; a page at a time, only the
    pod's budgets are kept."""
    import tracemalloc

    fake = PagedKube(foreign=50_000)
    fake.claims = [claim("train-gpu", POD_UID, "16Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    tracemalloc.start()
    try:
        reader.refresh()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [b.claim for b in reader.budgets()] == ["train-gpu"]
    assert len(fake.pages) == 501 and {(limit, size) for limit, _, size in fake.pages} == {(100, 2 * 2**20)}
    assert peak < 8 * 2**20, peak  # a page of 100 claims, not 50,000
    assert reader.counts() == {"read": 1, "failed": 0, "malformed": 0, "truncated": 0}


def test_a_listing_past_the_page_bound_is_truncated_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from oomsight_sidecar import claims as claims_mod

    monkeypatch.setattr(claims_mod, "MAX_PAGES", 3)
    fake = PagedKube(foreign=1_000)
    fake.claims = [claim("train-gpu", POD_UID, "16Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    reader.refresh()
    assert len(fake.pages) == 3 and reader.budgets() == []
    assert reader.counts() == {"read": 1, "failed": 0, "malformed": 0, "truncated": 1}


@pytest.mark.parametrize(
    "answer",
    [
        {"items": 5},
        {"items": "claims"},
        {"items": [5, "x", None, {"status": "allocated"}, {"status": {"reservedFor": 7}}]},
        {"kind": "Status"},
        [],
        None,
    ],
)
def test_malformed_listings_are_counted_and_never_end_the_refresh_thread(answer: Any) -> None:
    """Issue 36: a list whose items is 5, or a claim whose status is a string, ended the thread for good."""
    fake = FakeKube()
    fake.claims = [claim("train-gpu", POD_UID, "24Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    reader.refresh()
    good = fake.list_resource_claims
    fake.list_resource_claims = lambda namespace: answer  # type: ignore[method-assign]
    stop = threading.Event()
    thread = start_refresh(reader, stop, interval_seconds=0.01)
    try:
        for _ in range(200):
            if reader.counts()["malformed"] >= 3:
                break
            threading.Event().wait(0.01)
        assert thread.is_alive() and reader.counts()["malformed"] >= 3
        fake.claims = [claim("train-gpu", POD_UID, "32Gi")]
        fake.list_resource_claims = good  # type: ignore[method-assign]
        for _ in range(200):
            if [b.memory_bytes for b in reader.budgets()] == [32 * 2**30]:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert [b.memory_bytes for b in reader.budgets()] == [32 * 2**30]  # still reading after the bad answers


def test_a_claim_whose_status_is_a_string_is_skipped_and_the_others_read() -> None:
    fake = FakeKube()
    broken = claim("broken", POD_UID, "8Gi")
    broken["status"] = "allocated"
    odd = claim("odd", POD_UID, "8Gi")
    odd["status"]["allocation"]["devices"]["results"] = {"not": "a list"}
    fake.claims = [broken, odd, claim("train-gpu", POD_UID, "16Gi")]
    reader = ClaimReader(lambda: fake, "ml", POD_UID)
    reader.refresh()
    assert [b.claim for b in reader.budgets()] == ["train-gpu"]
    assert reader.counts() == {"read": 1, "failed": 0, "malformed": 2, "truncated": 0}
