"""The sidecar's probes follow what /metrics can do: /readyz 503 while collects fail or
hang, /healthz 500 while one hangs (the kubelet restarts a stuck sidecar); HEAD works."""

import http.client
import os
import threading

import pytest

from oomsight.metrics.collector import SpoolCollector
from oomsight.wire.spool import SpoolReader
from oomsight_server.wsgi import serve, stop
from oomsight_sidecar.server import CollectWatch, MetricsApp

from procs import wait_for
from spoolmaker import hooked_process


class GatedReader(SpoolReader):
    """A real spool reader that can be made to raise or to block, as a hung NFS mount does."""

    def __init__(self, spool_dir):
        super().__init__(spool_dir)
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def read(self):
        if self.fail:
            raise OSError(5, "Input/output error")
        self.gate.wait(30)
        return super().read()


@pytest.fixture
def served(spool, monkeypatch):
    hooked_process(spool, monkeypatch=monkeypatch)
    reader = GatedReader(spool)
    collector = SpoolCollector(spool, reader=reader)
    server = serve(MetricsApp(collector, watch=CollectWatch(hung_after_seconds=0.5)), "127.0.0.1", 0)
    yield reader, server.server_port
    reader.gate.set()
    stop(server)


def request(port, path, method="GET", timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(method, path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), body


def test_readyz_is_503_while_the_last_collect_raised_and_ready_again_after_a_good_one(served):
    reader, port = served
    assert request(port, "/metrics")[0] == 200
    assert request(port, "/readyz")[0] == 200
    reader.fail = True
    assert request(port, "/metrics")[0] == 500
    status, _, body = request(port, "/readyz")
    assert status == 503 and b"Input/output error" in body
    assert request(port, "/healthz")[0] == 200  # failing is not hanging: no restart
    reader.fail = False
    assert request(port, "/readyz")[0] == 200  # the probe itself sees the recovery


def test_a_hung_collect_makes_healthz_500_and_readyz_503_until_it_returns(served):
    reader, port = served
    reader.gate.clear()
    scrape = threading.Thread(target=request, args=(port, "/metrics", "GET", 30.0), daemon=True)
    scrape.start()
    wait_for(lambda: request(port, "/healthz")[0] == 500, timeout=10)
    status, _, body = request(port, "/readyz")
    assert status == 503 and b"running for" in body
    reader.gate.set()
    scrape.join(10)
    assert request(port, "/healthz")[0] == 200
    assert request(port, "/readyz")[0] == 200


def test_head_metrics_answers_200_with_the_headers_of_get_and_no_body(served):
    _, port = served
    status, headers, body = request(port, "/metrics", method="HEAD")
    _, get_headers, get_body = request(port, "/metrics")
    assert (status, body) == (200, b"")
    assert headers["Content-Type"] == get_headers["Content-Type"]
    assert abs(int(headers["Content-Length"]) - len(get_body)) < 200  # sample values move between the two
    assert request(port, "/readyz", method="HEAD")[:1] == (200,)


def test_the_spool_not_existing_yet_is_not_ready_but_alive(tmp_path):
    spool = str(tmp_path / "later")
    server = serve(MetricsApp(SpoolCollector(spool)), "127.0.0.1", 0)
    try:
        assert request(server.server_port, "/readyz")[0] == 503
        assert request(server.server_port, "/healthz")[0] == 200
        os.makedirs(spool)
        assert request(server.server_port, "/readyz")[0] == 200
    finally:
        stop(server)
