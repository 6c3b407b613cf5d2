"""The cached exposition (issue 13, "Incremental reads"): a scrape parses only the files that
changed, renders only the processes whose inputs changed, and its text equals, byte for byte
and sample for sample, what prometheus_client writes for the collector's families."""

import gzip
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder
from prometheus_client.openmetrics import exposition as om
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from oomsight.metrics.collector import LAYOUT, SpoolCollector, families, parts
from oomsight.metrics.exposition import ExpositionCache, Part
from oomsight.tools import tape
from oomsight.tools.demo import TAPE

import exposition_states
from fakes import GIB
from hostile import NOW, event, event_path, put, snapshot, snapshot_path
from spoolmaker import hooked_process

FORMATS = [
    (generate_latest, CONTENT_TYPE_PLAIN_0_0_4, parse_text),
    (om.generate_latest, om.CONTENT_TYPE_LATEST, parse_openmetrics),
    (*choose_encoder("application/openmetrics-text; version=1.0.0; escaping=allow-utf-8"), parse_openmetrics),
    (*choose_encoder("text/plain; version=1.0.0; escaping=dots"), parse_text),
]


class Families:
    def __init__(self, found):
        self.found = found

    def collect(self):
        return self.found


def samples(text, parse):
    return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for f in parse(text) for s in f.samples)


def assert_cached_equals_uncached(collector):
    """One read; for every format, the cached text is the uncached text, byte for byte, and
    both parsers read the same samples from it."""
    inv = collector.inventory()
    for encoder, fmt, parse in FORMATS:
        uncached = encoder(Families(families(inv)))
        cached = collector.cache.render(LAYOUT, parts(inv), encoder, fmt)
        assert cached == uncached, fmt
        assert samples(cached.decode(), parse) == samples(uncached.decode(), parse)
    return inv


INTENDED: dict[bytes, bytes] = {}
"""Changes made on purpose since the fixtures were recorded: old text -> new text."""


@pytest.mark.parametrize("name", [name for name, _ in exposition_states.states()])
def test_every_recorded_state_is_served_byte_for_byte_as_before(name):
    recorded = exposition_states.recorded()
    run = dict(exposition_states.states())[name]
    texts, want = recorded["texts"], recorded["states"][name]
    got = run(exposition_states.served)
    assert sorted(got) == sorted(want)
    for key, text in got.items():
        expected = texts[want[key]].encode()
        for old, new in INTENDED.items():
            expected = expected.replace(old, new)
        assert text == expected, key


def test_the_cached_exposition_is_the_uncached_one_all_along_the_shipped_tape(tmp_path):
    spool = str(tmp_path)
    collector = SpoolCollector(spool)
    seen = {"states": 0}

    def after(record):
        seen["states"] += 1
        if seen["states"] % 5 == 0:  # one cache throughout: kept text meets changed files
            assert_cached_equals_uncached(collector)

    tape.replay(TAPE, spool, speed=1e9, sleep=lambda _s: None, on_record=after)
    inv = assert_cached_equals_uncached(collector)
    assert seen["states"] > 20 and len(inv.processes) == 2 and sum(t.events for t in inv.ooms.values()) >= 1


def test_the_cached_exposition_is_the_uncached_one_through_a_hooked_run(spool, monkeypatch):
    clock = [time.time()]
    collector = SpoolCollector(spool, clock=lambda: clock[0])
    first, cuda = hooked_process(spool, rank=0, monkeypatch=monkeypatch)
    assert_cached_equals_uncached(collector)
    hooked_process(spool, rank=1, allocated=7 * GIB, reserved=8 * GIB, monkeypatch=monkeypatch)
    assert_cached_equals_uncached(collector)
    cuda.observer(0, 100 * GIB, 140 * GIB, 2 * GIB)  # an OOM, pending
    assert_cached_equals_uncached(collector)
    first.uncaught = RuntimeError("CUDA out of memory")
    first.at_exit()  # fatal, process exited
    assert_cached_equals_uncached(collector)
    clock[0] += 31  # the other rank goes stale: up 0, exit "vanished"
    assert_cached_equals_uncached(collector)
    clock[0] += 400  # both past retention: their series go, the OOM counts stay
    inv = assert_cached_equals_uncached(collector)
    assert inv.processes == [] and len(collector.cache) == len(inv.ooms)


def test_an_unchanged_spool_is_neither_parsed_nor_rendered_again(spool):
    for pid in (1, 2, 3):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
    collector = SpoolCollector(spool, clock=lambda: NOW)

    def scrape(encoder=generate_latest, fmt=CONTENT_TYPE_PLAIN_0_0_4):
        text = collector.exposition(encoder, fmt)
        return text, collector.reader.parsed, collector.cache.rendered

    first, parsed, rendered = scrape()
    assert parsed == 3 and rendered > 3 * 30  # each rank's 30-odd families, each tally's three
    for _ in range(3):
        assert scrape() == (first, 3, rendered)
    put(spool, snapshot_path(2), snapshot(pid=2, rank=2, t=NOW - 1))  # written again: only its age moved
    assert scrape()[1:] == (4, rendered)
    moved = snapshot(pid=2, rank=2, t=NOW - 1)
    moved["devices"][0]["allocator"]["allocated_bytes"] += 1
    put(spool, snapshot_path(2), moved)
    assert scrape()[1:] == (5, rendered + 1)  # one sample moved: its family alone is rendered again
    _, parsed, in_text = scrape(om.generate_latest, om.CONTENT_TYPE_LATEST)
    assert parsed == 5 and in_text - rendered - 1 > 3 * 30  # a second format: rendered once
    assert scrape(om.generate_latest, om.CONTENT_TYPE_LATEST)[1:] == (5, in_text)


def test_step_rows_that_did_not_move_are_not_judged_again(spool, monkeypatch):
    from oomsight.analysis import trend

    judged = []
    analyse = trend.analyse
    monkeypatch.setattr(trend, "analyse", lambda rows, capacity: judged.append(len(rows)) or analyse(rows, capacity))
    put(spool, snapshot_path(1), snapshot(pid=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    assert_cached_equals_uncached(collector)
    assert len(judged) == 1
    put(spool, snapshot_path(1), snapshot(pid=1, t=NOW - 1))  # parsed again, the same rows: the same trend
    assert_cached_equals_uncached(collector)
    assert collector.reader.parsed == 2 and len(judged) == 1
    moved = snapshot(pid=1, t=NOW - 1)
    moved["devices"][0]["steps_memory"][-1][3] += 2**30  # a new step peak: judged again
    put(spool, snapshot_path(1), moved)
    assert_cached_equals_uncached(collector)
    assert len(judged) == 2


def test_a_hooks_own_verdict_is_read_not_judged_again_and_an_older_writers_rows_still_are(spool, monkeypatch):
    from oomsight.analysis import trend

    judged = []
    analyse = trend.analyse
    monkeypatch.setattr(trend, "analyse", lambda rows, capacity: judged.append(len(rows)) or analyse(rows, capacity))
    older = snapshot(pid=1)
    rows = older["devices"][0]["steps_memory"]
    newer = snapshot(pid=2, rank=1)
    verdict = trend.verdict(analyse(rows, older["devices"][0]["total_bytes"]))
    verdict.update(leak=True, floor_slope_bytes=12345.0, steps_to_oom=None)
    newer["devices"][0].update(steps_memory=rows[-1:], step_trend=verdict)
    put(spool, snapshot_path(1), older)
    put(spool, snapshot_path(2), newer)
    reg = CollectorRegistry()
    reg.register(SpoolCollector(spool, clock=lambda: NOW))
    def value(name, rank):
        labels = {"rank": rank, "local_rank": rank, "device": "0", "gpu_uuid": newer["devices"][0]["uuid"]}
        return reg.get_sample_value(name, labels)

    assert value("oomsight_leak_suspected", "1") == 1.0 and value("oomsight_leak_suspected", "0") == 0.0
    assert value("oomsight_step_floor_slope_bytes", "1") == 12345.0
    assert value("oomsight_oom_forecast_steps", "1") == float("inf")
    assert value("oomsight_step_floor_allocated_bytes", "1") == rows[-1][2]
    assert judged and set(judged) == {len(rows)}  # the older writer's rows alone, never the newer's one


def test_the_cache_holds_only_what_the_last_scrape_served(spool):
    for pid in (1, 2, 3):
        put(spool, snapshot_path(pid), snapshot(pid=pid, rank=pid))
    put(spool, event_path(1, 1), event(pid=1, rank=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    assert_cached_equals_uncached(collector)
    assert len(collector.cache) == 3 * 2 + 3  # each process's own part and its steps and devices; OOM tallies
    os.unlink(os.path.join(spool, snapshot_path(3)))  # its file is gone: so are its series
    inv = assert_cached_equals_uncached(collector)
    assert [v.rank_labels for v in inv.processes] == [("1", "1"), ("2", "2")]
    assert len(collector.cache) == 2 * 2 + 3  # its OOM counters stay, at 0 (the Ledger: they never vanish)


def test_a_file_that_turns_bad_drops_its_series_and_is_counted_as_without_the_cache(spool):
    put(spool, snapshot_path(1), snapshot(pid=1, rank=0))
    put(spool, snapshot_path(2), snapshot(pid=2, rank=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    assert_cached_equals_uncached(collector)
    put(spool, snapshot_path(2), b"{torn")
    inv = assert_cached_equals_uncached(collector)
    assert [v.rank_labels for v in inv.processes] == [("0", "0")] and inv.skipped_total["corrupt"] == 1
    put(spool, snapshot_path(2), snapshot(pid=2, rank=1, t=NOW - 2))  # and healed
    assert len(assert_cached_equals_uncached(collector).processes) == 2


def test_a_process_going_stale_is_rendered_again_and_its_age_is_fresh_on_every_scrape(spool):
    clock = [NOW]
    put(spool, snapshot_path(1), snapshot(pid=1))
    collector = SpoolCollector(spool, clock=lambda: clock[0])
    for step, up in ((1, 1.0), (10, 1.0), (40, 0.0)):
        clock[0] = NOW + step
        text = collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4).decode()
        found = {s.name: s.value for f in parse_text(text) for s in f.samples if s.labels.get("rank") == "0"}
        assert found["oomsight_snapshot_age_seconds"] == step
        assert found["oomsight_process_up"] == up
    assert_cached_equals_uncached(collector)


def test_the_sidecar_collectors_come_after_the_spool_and_openmetrics_ends_once(spool):
    put(spool, snapshot_path(1), snapshot(pid=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    others = CollectorRegistry()

    class Sidecar:
        def collect(self):
            fam = GaugeMetricFamily("oomsight_sidecar_test", "A sidecar family.", labels=["x"])
            fam.add_metric(["y"], 1)
            yield fam

    others.register(Sidecar())
    whole = CollectorRegistry()
    whole.register(collector)
    whole.register(others)
    for encoder, fmt, _ in FORMATS:
        assert collector.exposition(encoder, fmt, others) == encoder(whole), fmt
    assert collector.exposition(om.generate_latest, om.CONTENT_TYPE_LATEST, others).count(b"# EOF") == 1


def test_text_a_format_does_not_cut_is_rendered_whole_and_said_once(spool, caplog):
    put(spool, snapshot_path(1), snapshot(pid=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)

    def odd(registry):  # a future format that writes each family's samples before its header
        out = []
        for f in registry.collect():
            body = generate_latest(Families([f])).split(b"\n", 2)
            out.append(body[2] + body[0] + b"\n" + body[1] + b"\n")
        return b"".join(out)

    for _ in range(2):
        text = collector.exposition(odd, "odd")
        assert text == odd(Families(families(collector.last_inventory)))
    assert collector.cache.drifted == 2
    assert sum("rendered whole" in r.getMessage() for r in caplog.records) == 1
    assert collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4) == generate_latest(
        Families(families(collector.last_inventory))
    )


def test_a_fifth_format_starts_the_cache_afresh():
    layout = [GaugeMetricFamily("oomsight_test", "A family.", labels=["x"])]

    def build():
        fam = GaugeMetricFamily("oomsight_test", "A family.", labels=["x"])
        fam.add_metric(["y"], 1)
        return [fam]

    cache = ExpositionCache()
    for i in range(6):
        assert cache.render(layout, [Part(("p",), (1,), build)], generate_latest, f"text-{i}") == generate_latest(
            Families(build())
        )
    assert len(cache._formats) <= 4 and cache.rendered == 6 and len(cache) == 1


def test_an_unchanged_spool_of_64_ranks_scrapes_in_a_small_part_of_a_changed_one(spool):
    """Timing, made robust for a loaded 2-core CI machine: best of several, generous bounds."""
    ranks = 64
    for i in range(ranks):
        put(spool, snapshot_path(i + 1), snapshot(pid=i + 1, rank=i))
    collector = SpoolCollector(spool, clock=lambda: NOW)

    def scrape():
        t0 = time.perf_counter()
        collector.exposition(generate_latest, CONTENT_TYPE_PLAIN_0_0_4)
        return time.perf_counter() - t0

    changed = []
    for seq in range(3):
        for i in range(ranks):
            put(spool, snapshot_path(i + 1), {**snapshot(pid=i + 1, rank=i), "seq": seq + 2})
        changed.append(scrape())
    unchanged = min(scrape() for _ in range(5))
    assert unchanged < 0.25  # about 2 ms on an idle core
    assert unchanged < min(changed) / 3, (unchanged, changed)


def wsgi(app, method="GET", query="", **headers):
    seen = {}

    def start_response(status, response_headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(response_headers)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": "/metrics", "QUERY_STRING": query, **headers}
    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"HTTP_ACCEPT": "application/openmetrics-text; version=1.0.0"},
        {"HTTP_ACCEPT": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"},
        {"HTTP_ACCEPT": "text/plain; version=1.0.0; escaping=allow-utf-8"},
        {"HTTP_ACCEPT_ENCODING": "gzip, deflate"},
        {"HTTP_ACCEPT": "application/openmetrics-text", "HTTP_ACCEPT_ENCODING": "gzip"},
    ],
)
@pytest.mark.parametrize("query", ["", "name[]=oomsight_process_up&name[]=oomsight_sidecar_http_errors_total"])
def test_the_sidecar_answers_metrics_as_prometheus_client_s_own_app_does(spool, headers, query):
    from oomsight_sidecar.listener import ServerErrors
    from oomsight_sidecar.server import MetricsApp, ServerCollector

    put(spool, snapshot_path(1), snapshot(pid=1))
    put(spool, event_path(1, 1), event(pid=1))
    collector = SpoolCollector(spool, clock=lambda: NOW)
    others = CollectorRegistry()
    others.register(ServerCollector(ServerErrors()))
    app = MetricsApp(collector, others)
    reference = make_wsgi_app(app.registry)
    for _ in range(2):  # the second answer from the cache
        status, got_headers, body = wsgi(app, query=query, **headers)
        want = wsgi(reference, query=query, **headers)
        assert (status, got_headers) == want[:2]
        if got_headers.get("Content-Encoding") == "gzip":
            body, want = gzip.decompress(body), (*want[:2], gzip.decompress(want[2]))
        assert body == want[2]
    assert wsgi(app, method="OPTIONS")[:2] == wsgi(reference, method="OPTIONS")[:2]


def test_the_kept_value_texts_are_what_prometheus_client_writes_zeros_of_either_sign_included():
    from prometheus_client.utils import floatToGoString

    from oomsight.metrics.rows import line_end_of

    values = [0, 0.0, -0.0, 0, -0.0, 1, 1.0, True, 2**53 + 1, 2.0**53, float("nan"), float("inf"), -1e300, 0.1]
    for v in values + values[::-1]:  # each seen twice, in both orders
        assert line_end_of(v) == floatToGoString(v) + "\n", v


@settings(max_examples=3000, deadline=None)
@given(
    st.one_of(
        st.integers(min_value=-(2**63), max_value=2**63),
        st.integers(min_value=0, max_value=10**16),
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=0, max_value=1e7),
        st.booleans(),
    )
)
def test_the_fast_value_text_is_floattogostring_on_any_number(value):
    from prometheus_client.utils import floatToGoString

    from oomsight.metrics.rows import _fast_go, value_text

    assert value_text is _fast_go  # this prometheus_client writes values as the fast path assumes
    assert _fast_go(value) == floatToGoString(value)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.sampled_from("abcd"), max_size=6)),  # (sequence shared with, families)
        max_size=12,
    )
)
def test_parts_put_in_family_order_a_column_at_a_time_are_what_a_line_at_a_time_gives(specs):
    from oomsight.metrics.assembly import assemble, grouped

    shared: dict[int, list[str]] = {}
    parts, naive = [], {name: [f"# {name}\n"] for name in "dcba"}
    for index, (share, names) in enumerate(specs):
        families = shared.setdefault(share, names)
        if families != names:  # another sequence: an object of its own
            families = list(names)
        lines = [f"{name} part{index} line{j}\n" for j, name in enumerate(families)]
        parts.append((families, lines))
        for name, line in zip(families, lines):
            naive[name].append(line)
    headers = {name: f"# {name}\n" for name in "dcba"}
    assert assemble(headers, grouped(parts)) == "".join(line for lines in naive.values() for line in lines)


def test_a_family_outside_the_layout_is_an_error_not_a_silent_loss():
    from oomsight.metrics.assembly import assemble, grouped

    with pytest.raises(KeyError):
        assemble({"a": "# a\n"}, grouped([(["a", "z"], ["a 1\n", "z 1\n"])]))
