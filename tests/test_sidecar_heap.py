"""The sidecar under spool poison (issue 49): a folder of tens of thousands of names is listed without holding
an entry object for each, the kubernetes package is not imported where no cluster named its API server, and
the C heap keeps one arena and gives free pages back at most every interval. The real sidecar's peak and
its memory after the junk is gone are measured by ``benchmarks/bench_scrape_budget.py``."""

import os
import subprocess
import sys
import tracemalloc

import pytest

from oomsight.wire.reader import Budget
from oomsight.wire.spool import SpoolReader
from oomsight_server import kube
from oomsight_sidecar import heap, main


def test_a_folder_of_20000_names_is_listed_to_its_budget_holding_little_on_the_way(tmp_path):
    folder = tmp_path / "events"
    folder.mkdir()
    for i in range(20_000):
        (folder / f"junk-{i:05d}.json").touch()
        if i % 5000 == 0:
            os.utime(folder / f"junk-{i:05d}.json", (2e9, 2e9))  # the newest
    reader = SpoolReader(str(tmp_path), budget=Budget(entries_per_folder=100))
    tracemalloc.start()
    try:
        paths = reader._files(str(folder))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert paths is not None and len(paths) == 100
    assert {f"junk-{i:05d}.json" for i in range(0, 20_000, 5000)} <= {os.path.basename(p) for p in paths}
    assert reader._unlisted[str(folder)] == 19_900
    assert peak < 4 * 1024 * 1024, peak  # a DirEntry per name held 11 MB here


def test_outside_a_cluster_the_kubernetes_client_is_not_built(monkeypatch):
    built = []
    monkeypatch.delenv(main.SERVICE_HOST, raising=False)
    monkeypatch.setattr(main.KubeClient, "in_cluster", classmethod(lambda cls: built.append(1)))
    try:
        main.in_cluster_client()
    except RuntimeError as exc:
        assert main.SERVICE_HOST in str(exc)
    else:
        raise AssertionError("no error outside a cluster")
    monkeypatch.setenv(main.SERVICE_HOST, "10.0.0.1")
    main.in_cluster_client()
    assert built == [1]


NO_TOKEN = """
import os, sys
from oomsight_server import kube
from oomsight_sidecar import main
kube.SERVICE_TOKEN_FILE = sys.argv[1]
os.environ[main.SERVICE_HOST] = "10.0.0.1"
started = "kubernetes" in sys.modules
try:
    main.in_cluster_client()
except RuntimeError as exc:
    print(started, "kubernetes" in sys.modules, exc)
"""


def test_a_pod_without_a_service_account_token_never_imports_the_kubernetes_package(tmp_path):
    """The sidecar's start and a pod with ``automountServiceAccountToken: false`` (its API server named, no token)
    do not pay the package's 42 MiB (``import kubernetes.client.api.events_v1_api`` imports all of it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    found = subprocess.run(
        [sys.executable, "-c", NO_TOKEN, str(tmp_path / "token")], env=env, capture_output=True, text=True, timeout=60
    )
    assert found.stdout.startswith("False False no service account token at "), found.stdout + found.stderr


def test_the_token_checked_is_the_one_the_kubernetes_client_reads():
    incluster_config = pytest.importorskip("kubernetes.config.incluster_config")
    assert kube.SERVICE_TOKEN_FILE == incluster_config.SERVICE_TOKEN_FILENAME


def test_the_heap_is_collected_and_trimmed_at_most_once_an_interval():
    now = [0.0]
    trim = heap.Trim(interval_seconds=10.0, clock=lambda: now[0])
    for t in (0.0, 1.0, 9.9, 10.0, 10.5, 25.0):
        now[0] = t
        trim()
    assert trim.collections == 3
    assert trim.trims == (3 if trim._libc is not None else 0)  # not glibc: no trim
    assert heap.one_arena() in (True, False)
