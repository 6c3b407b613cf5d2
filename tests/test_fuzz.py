"""Hypothesis-driven: hostile variants of real documents through every reader (spool reader,
collector, inventory, text report, Event poster) with no escaped error; and counters that
never go backwards whatever faults a run of scrapes meets."""

import errno
import json
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics import exposition as om
from test_events import POD

from oomsight.analysis.inventory import take_inventory
from oomsight.metrics.collector import SpoolCollector
from oomsight.tools import report, report_html
from oomsight.wire.spool import SpoolReader
from oomsight_sidecar.events import EventPoster

from hostile import NOW, cases_run, event, event_path, mutate, paths_of, put, snapshot, snapshot_path
from kubetools import FakeKube

DOCS_PER_EXAMPLE = 50
EXAMPLES = 200
"""10,000 documents in all (``test_fuzzed_documents_never_escape_a_reader``)."""
fuzzed = {"documents": 0}

hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(categories=["Cs", "Lu", "Nd", "Zs", "Cc"]), max_size=6),
    st.sampled_from(["", "running", "exited", "pending", "fatal", "recovered", "snapshot", "oom_event"]),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.sampled_from(["index", "uuid", "nvml", "x"]), st.integers(), max_size=2),
    st.integers(min_value=1, max_value=3000).map(lambda n: {"deep": json.loads("[" * min(n, 900) + "]" * min(n, 900))}),
)


WHERE = {"snapshot": paths_of(snapshot()), "oom_event": paths_of(event())}
"""The places a mutation can change, the same for every pid and rank (computed once)."""


@st.composite
def hostile_document(draw):
    kind = draw(st.sampled_from(["snapshot", "oom_event"]))
    pid = draw(st.integers(min_value=1, max_value=6))
    doc = snapshot(pid=pid, rank=pid % 3) if kind == "snapshot" else event(pid=pid, rank=pid % 3)
    mutate(draw, doc, WHERE[kind], hostile_values)
    data = json.dumps(doc, allow_nan=True).encode()
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        cut = draw(st.integers(min_value=0, max_value=len(data)))
        data = data[:cut]  # a torn or foreign file
    rel = snapshot_path(pid) if kind == "snapshot" else event_path(pid, draw(st.integers(min_value=1, max_value=4)))
    return rel, data


def every_reader(spool, now):
    """Scrape (uncached, then cached in both formats: the same text), inventory, report and
    post once; return the scrape's text."""
    reg = CollectorRegistry()
    collector = SpoolCollector(spool, clock=lambda: now)
    reg.register(collector)
    text = generate_latest(reg).decode()
    assert collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4).decode() == text
    assert collector.exposition(om.generate_latest, om.CONTENT_TYPE_LATEST) == om.generate_latest(reg)
    inv = take_inventory(SpoolReader(spool).read(), now)
    report.render(inv, spool)
    EventPoster(spool, POD, lambda: FakeKube()).tick()
    return text


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True
)
@given(st.lists(hostile_document(), min_size=DOCS_PER_EXAMPLE, max_size=DOCS_PER_EXAMPLE))
def test_fuzzed_documents_never_escape_a_reader(batch):
    spool = tempfile.mkdtemp(prefix="oomsight-fuzz-")
    try:
        for i, (rel, data) in enumerate(batch):
            put(spool, rel.replace(".json", f"{i % 7}.json") if i % 2 else rel, data)
        fuzzed["documents"] += len(batch)
        assert "oomsight_source_up" in every_reader(spool, NOW)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def test_the_fuzz_ran_ten_thousand_documents():
    assert cases_run(fuzzed, "documents", test_fuzzed_documents_never_escape_a_reader) >= 10_000


FAULTS = ("go_silent", "publish", "oom", "recover_all", "events_unreadable", "fds_exhausted", "heal")
COUNTERS = ("oomsight_oom_events_total", "oomsight_oom_fatal_events_total", "oomsight_oom_recovered_events_total")


def counter_samples(text):
    out = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in COUNTERS or name == "oomsight_spool_skipped_files_total":
            series, value = line.rsplit(" ", 1)
            out[series] = float(value)
    return out


class FaultySpool:
    """A spool with one or two processes whose runs meet the faults of ``FAULTS``."""

    def __init__(self, root):
        self.root, self.now, self.seq, self.broken = root, NOW, 0, set()
        put(root, snapshot_path(1), snapshot(pid=1, t=self.now))

    def apply(self, fault):
        if fault == "go_silent":
            self.now += 100  # past stale-after: pending OOMs read as fatal
        elif fault == "publish":
            self.now += 1
            put(self.root, snapshot_path(1), snapshot(pid=1, t=self.now))
        elif fault == "oom":
            self.seq += 1
            put(self.root, event_path(1, self.seq), event(pid=1, seq=self.seq, t=self.now))
        elif fault == "recover_all":
            for seq in range(1, self.seq + 1):
                put(self.root, event_path(1, seq), event(pid=1, seq=seq, t=self.now, outcome="recovered"))
        elif fault == "heal":
            self.broken.clear()
        else:
            self.broken.add(fault)

    def scandir(self, real):
        """``os.scandir`` meeting the faults (the reader lists a folder through its descriptor)."""

        def scandir(path="."):
            where = os.path.realpath(f"/proc/self/fd/{path}") if isinstance(path, int) else str(path)
            if "fds_exhausted" in self.broken:
                raise OSError(errno.EMFILE, "Too many open files")
            if "events_unreadable" in self.broken and where.endswith("events"):
                raise PermissionError(errno.EACCES, "Permission denied")
            return real(path)

        return scandir


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(st.sampled_from(FAULTS), min_size=1, max_size=25))
def test_counters_never_go_backwards_whatever_faults_a_run_meets(faults):
    root = tempfile.mkdtemp(prefix="oomsight-faults-")
    spool = FaultySpool(root)
    collector = SpoolCollector(root, clock=lambda: spool.now)
    real = os.scandir
    last = {}
    try:
        for fault in faults:
            spool.apply(fault)
            os.scandir = spool.scandir(real)
            try:
                reg = CollectorRegistry()
                reg.register(collector)
                text = generate_latest(reg).decode()
                cached = collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4).decode()  # read again
            finally:
                os.scandir = real
            assert cached == text, (fault, faults)  # the sidecar's text is the collector's
            now = counter_samples(text)
            for series, value in last.items():
                assert now.get(series, -1) >= value, (series, fault, faults)
            last = now
    finally:
        os.scandir = real
        shutil.rmtree(root, ignore_errors=True)


def test_the_fault_model_can_lower_a_counter_without_the_ledger():
    """The property above could fail: without the ledger the same faults do lower counters."""
    root = tempfile.mkdtemp(prefix="oomsight-faults-")
    try:
        spool = FaultySpool(root)
        for fault in ("oom", "go_silent"):
            spool.apply(fault)
        inv = take_inventory(SpoolReader(root).read(), spool.now)
        assert [t.fatal for t in inv.ooms.values()] == [1]
        spool.apply("publish")
        inv = take_inventory(SpoolReader(root).read(), spool.now)
        assert [t.fatal for t in inv.ooms.values()] == [0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


HTML_EXAMPLES = 10
"""500 documents: the HTML report draws its charts with matplotlib (about 1.5 s a spool)."""


@pytest.mark.filterwarnings("ignore:No artists with labels found")
@settings(max_examples=HTML_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(hostile_document(), min_size=DOCS_PER_EXAMPLE, max_size=DOCS_PER_EXAMPLE))
def test_fuzzed_documents_never_break_the_html_report(batch):
    spool = tempfile.mkdtemp(prefix="oomsight-fuzz-html-")
    try:
        for i, (rel, data) in enumerate(batch):
            put(spool, rel.replace(".json", f"{i % 7}.json") if i % 2 else rel, data)
        assert report_html.build(spool, NOW, retention_seconds=1e9).rstrip().endswith("</html>")
    finally:
        shutil.rmtree(spool, ignore_errors=True)
