"""DRA claims read with a bound through the real ``KubeClient`` (issue 36): a loopback API server
(``kubeapi.ClaimsServer``) pages the kubernetes client's own ``resource.k8s.io/v1`` claims by ``limit``
and ``continue``; the sidecar asks a page at a time, reads each page only up to its byte bound, keeps
only the keys it reads, skips and counts what is not a claim, and lives on through bad answers. The
real sidecar, as in a pod over HTTPS, stays within 85 % of the chart's memory limit among 50,000
claims of other pods (292.9 MiB before)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

import pytest
from test_budget import MARGIN, chart_limit_kib, sample
from test_claims import POD_UID, claim

from oomsight_server.kube import CLAIM_KEYS, KubeClient, PageTooLarge
from oomsight_sidecar.claims import PAGE_CLAIMS, PAGE_MAX_BYTES, ClaimReader, start_refresh

from kubeapi import IN_POD, ClaimsServer, claims_server
from procs import free_port, http_get, wait_for

NEIGHBOUR = claim("neighbour-gpu", "other-pod-uid", "40Gi", share="s-2")


@contextmanager
def real_client(server: ClaimsServer) -> Iterator[KubeClient]:
    from kubernetes import client

    with claims_server(server):
        config = client.Configuration()
        config.host = f"http://127.0.0.1:{server.server_address[1]}"
        yield KubeClient(client.ApiClient(config), timeout_seconds=5)


def annotated(name: str, pod_uid: str, size: int) -> dict[str, Any]:
    doc = claim(name, pod_uid, "16Gi")
    doc["metadata"]["annotations"] = {"example.com/note": "n" * size}
    return doc


def test_the_real_client_lists_a_page_at_a_time_and_keeps_only_the_keys_read() -> None:
    server = ClaimsServer("ml", [claim("train-gpu", POD_UID, "16Gi")], NEIGHBOUR, foreign=1_050)
    with real_client(server) as kube:
        page = kube.list_resource_claims_page("ml", 100, "", PAGE_MAX_BYTES)
        reader = ClaimReader(lambda: kube, "ml", POD_UID)
        reader.refresh()
    assert len(page["items"]) == 100 and page["metadata"] == {"continue": "100"}
    kept: set[str] = set()

    def keys(value: Any) -> None:
        if isinstance(value, dict):
            kept.update(value)
            for v in value.values():
                keys(v)
        elif isinstance(value, list):
            for v in value:
                keys(v)

    keys(page)
    assert kept <= CLAIM_KEYS and "spec" not in kept and "annotations" not in kept and "shareID" not in kept
    assert [b.claim for b in reader.budgets()] == ["train-gpu"]
    assert reader.counts() == {"read": 1, "failed": 0, "malformed": 0, "truncated": 0}
    assert server.requests[1:] == [(PAGE_CLAIMS, ""), *((PAGE_CLAIMS, str(n)) for n in range(100, 1_051, 100))]


def test_claims_with_long_annotations_are_asked_for_again_a_few_a_page() -> None:
    """The issue's 200 claims with 100 KB annotations (130.5 MiB): 100 of them are a 10 MB page, over the
    bound; the same page is asked for again with a quarter of the claims until a page fits."""
    foreign = annotated("neighbour-gpu", "other-pod-uid", 100_000)
    server = ClaimsServer("ml", [annotated("train-gpu", POD_UID, 100_000)], foreign, foreign=199)
    with real_client(server) as kube:
        with pytest.raises(PageTooLarge):
            kube.list_resource_claims_page("ml", 100, "", PAGE_MAX_BYTES)
        server.requests.clear()
        reader = ClaimReader(lambda: kube, "ml", POD_UID)
        reader.refresh()
    assert [b.claim for b in reader.budgets()] == ["train-gpu"]
    assert reader.counts() == {"read": 1, "failed": 0, "malformed": 0, "truncated": 0}
    limits = [limit for limit, _ in server.requests]
    assert limits[:3] == [100, 25, 6] and set(limits[2:]) == {6}  # 6 claims of 100 KB: 600 KB a page
    assert server.largest_page > PAGE_MAX_BYTES  # the server sent it; the client read no more than the bound


def test_a_server_that_ignores_the_limit_fails_the_listing_within_the_bound() -> None:
    """A server that answers every page with all 50,000 claims (25 MB): at most the bound is read a
    time, the listing counted failed, and the thread lives on."""
    server = ClaimsServer("ml", [claim("train-gpu", POD_UID)], NEIGHBOUR, foreign=50_000)
    whole = server.page(0, None)
    server.raw = lambda start, limit: whole
    with real_client(server) as kube:
        reader = ClaimReader(lambda: kube, "ml", POD_UID)
        reader.refresh()
    assert [limit for limit, _ in server.requests] == [100, 25, 6, 1]
    assert reader.budgets() == [] and reader.counts() == {"read": 0, "failed": 1, "malformed": 0, "truncated": 0}


BAD_PAGES = {
    "items is 5": b'{"kind":"ResourceClaimList","metadata":{},"items":5}',
    "status a string": json.dumps({"items": [{"metadata": {"name": "x"}, "status": "allocated"}]}).encode(),
    "results a map": json.dumps(
        {
            "items": [
                {
                    "status": {
                        "reservedFor": [{"resource": "pods", "uid": POD_UID}],
                        "allocation": {"devices": {"results": {"device": "gpu-0"}}},
                    }
                }
            ]
        }
    ).encode(),
    "continue a number": json.dumps({"metadata": {"continue": 5}, "items": [7]}).encode(),
    "not JSON": b"<html>proxy error</html>",
    "a JSON list": b"[1, 2]",
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "cut short": b'{"items": [{"metadata": {"name": "x"',
}


@pytest.mark.parametrize("answer", list(BAD_PAGES), ids=list(BAD_PAGES))
def test_bad_answers_through_the_real_client_are_counted_and_the_thread_reads_on(answer: str) -> None:
    server = ClaimsServer("ml", [claim("train-gpu", POD_UID, "24Gi")])
    server.raw = lambda start, limit: BAD_PAGES[answer]
    with real_client(server) as kube:
        reader = ClaimReader(lambda: kube, "ml", POD_UID)
        stop = threading.Event()
        thread = start_refresh(reader, stop, interval_seconds=0.02)
        try:
            wait_for(lambda: reader.counts()["failed"] + reader.counts()["malformed"] >= 3, timeout=20)
            assert thread.is_alive()
            server.raw = None
            wait_for(lambda: [b.memory_bytes for b in reader.budgets()] == [24 * 2**30], timeout=20)
        finally:
            stop.set()
            thread.join(timeout=5)
    counts = reader.counts()
    assert counts["failed"] + counts["malformed"] >= 3 and counts["read"] >= 1, counts


def in_pod_sidecar(spool: str, api: ClaimsServer, tls_dir: str) -> subprocess.Popen[str]:
    """The real ``oomsight sidecar`` as the webhook injects it, its service account pointing at ``api``."""
    port = free_port()
    env = {
        **os.environ,
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.server_address[1]),
        "OOMSIGHT_POD_NAME": "train-0",
        "OOMSIGHT_POD_NAMESPACE": "ml",
        "OOMSIGHT_POD_UID": POD_UID,
        "OOMSIGHT_RESOURCE_CLAIMS": "1",
        "OOMSIGHT_ADMIN_PORT": "0",
    }
    tls = [os.path.join(tls_dir, "token"), os.path.join(tls_dir, "ca.crt")]
    command = [sys.executable, "-c", IN_POD, *tls, "sidecar", "--spool", spool, "--port", str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    proc.port = port  # type: ignore[attr-defined]
    return proc


def peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def claims_read(port: int) -> Optional[str]:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    return body if status == 200 and sample(body, "oomsight_resource_claim_reads_total", result="read") else None


def test_50_000_claims_of_other_pods_keep_the_real_sidecar_within_the_chart(tmp_path: Any, monkeypatch: Any) -> None:
    """Issue 36: one 25.6 MB list of 50,000 claims held 292.9 MiB in the sidecar."""
    from spoolmaker import hooked_process

    spool = str(tmp_path / "spool")
    hooked_process(spool, monkeypatch=monkeypatch)
    api = ClaimsServer("ml", [claim("train-gpu", POD_UID, "16Gi")], NEIGHBOUR, foreign=50_000)
    tls_dir = str(tmp_path / "serviceaccount")
    os.makedirs(tls_dir)
    with claims_server(api, tls_dir):
        proc = in_pod_sidecar(spool, api, tls_dir)
        try:
            started = time.monotonic()
            body = wait_for(lambda: claims_read(proc.port), timeout=120, interval=0.5)  # type: ignore[attr-defined]
            took = time.monotonic() - started
            peak = peak_kib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
    assert sample(body, "oomsight_gpu_memory_budget_bytes", claim="train-gpu") == 16 * 2**30, out[-2000:]
    assert sample(body, "oomsight_resource_claim_reads_total", result="failed") == 0
    assert len(api.requests) == 501 and api.largest_page < PAGE_MAX_BYTES
    limit = chart_limit_kib()
    print(
        f"50,000 claims read in {took:.1f} s; peak {peak / 1024:.1f} MiB of {limit / 1024:.0f} MiB ({peak / limit:.0%})"
    )
    assert peak <= MARGIN * limit, f"peak {peak / 1024:.1f} MiB over {MARGIN:.0%} of the chart's {limit / 1024:.0f} MiB"
