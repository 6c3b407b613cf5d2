"""The HTML report on the H200 demo tape (rank 1 leaks and dies of OOM) plus a profile, a
leak finding and batch advice written beside it, some of them with hostile strings."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from xml.etree import ElementTree

import pytest

from oomsight.analysis import timeline
from oomsight.tools import chart, cli, report_html, tape
from oomsight.tools.demo import TAPE
from oomsight.wire import schema
from oomsight.wire.spool import SpoolReader, SpoolState, write_atomic

from fakes import GIB, ROOT

EVIL_OP = "<script>alert(1)</script>"
EVIL_ARGV0 = '"><img src=x onerror=alert(2)>'


def _op(name: str, calls: int, mem: int, self_us: float) -> dict:
    return {
        "op": name,
        "calls": calls,
        "self_cuda_memory_bytes": mem,
        "self_cuda_time_us": self_us,
        "cuda_time_us": 1.5 * self_us,
        "cpu_time_us": self_us / 3,
    }


def _profile(process: dict, started_at: float) -> dict:
    doc = {
        "schema_version": 1,
        "kind": "profile",
        "process": process,
        "request_id": "req-7",
        "start_step": 1000,
        "steps": 5,
        "started_at": started_at,
        "ended_at": started_at + 1.5,
        "device": 0,
        "peak_allocated_bytes": 5 * GIB,
        "top_by_memory": [_op("aten::mm", 120, 3 * GIB, 5000.0), _op(EVIL_OP, 3, 1 << 20, 10.0)],
        "top_by_time": [_op("aten::addmm", 240, 0, 9000.0), _op("other", 40, -(1 << 28), 300.0)],
        "table_artifact": None,
        "trace_artifact": "req-7.trace.json.gz",
    }
    assert schema.validate(doc) == "profile"
    return doc


def _rewrite(path: str, change: dict) -> None:
    with open(path) as fh:
        doc = json.load(fh)
    doc.update(change)
    assert schema.validate(doc) == "snapshot"
    write_atomic(path, json.dumps(doc).encode(), durable=False)


def _spool(spool: str) -> None:
    """The tape with its real pacing on a fake clock (times spread as recorded, no waiting)."""
    now = [1_800_000_000.0]
    tape.replay(TAPE, spool, speed=1.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    snaps = {s["process"]["rank"]: s for s in SpoolReader(spool).read().snapshots}
    path = {r: os.path.join(spool, "snapshots", f"{s['process']['id']}.json") for r, s in snaps.items()}
    leak = {"checked_at": now[0], "step": 2000, "graph_tensors": 1900, "graph_bytes": 5 * GIB, "growth_bytes": GIB}
    _rewrite(path[1], {"leak": {**leak, "sites": ["train.py:42 in step"]}})
    advice = {"measured_at": now[0], "device": 0, "max_batch_size": 96, "margin_ratio": 0.1}
    advice |= {"capacity_bytes": 8 * GIB, "fixed_bytes": GIB, "bytes_per_sample": 0.06 * GIB, "source": "probe"}
    advice["points"] = [[8, 1.5 * GIB], [16, 2.0 * GIB], [32, 2.9 * GIB]]
    _rewrite(path[0], {"batch_advice": advice, "process": {**snaps[0]["process"], "argv0": EVIL_ARGV0}})
    profile = _profile(snaps[1]["process"], 1_800_000_020.0)
    write_atomic(os.path.join(spool, "profiles", "req-7.json"), json.dumps(profile).encode(), durable=False)
    memory_only = _profile(snaps[1]["process"], 1_800_000_030.0) | {"request_id": "mem-1", "cuda_time": False}
    memory_only["top_by_time"] = []
    assert schema.validate(memory_only) == "profile"
    write_atomic(os.path.join(spool, "profiles", "mem-1.json"), json.dumps(memory_only).encode(), durable=False)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("report")
    spool, out = str(folder / "spool"), str(folder / "report.html")
    _spool(spool)
    assert cli.main(["report", "--html", out, spool]) == 0
    assert set(os.listdir(folder)) == {"spool", "report.html"}  # one file: no images or styles beside it
    with open(out, encoding="utf-8") as fh:
        return fh.read()


def _without_svg(page: str) -> str:
    return re.sub(r"<svg.*?</svg>", "", page, flags=re.S)


def test_the_report_is_one_html_file_with_inline_svg_charts(page):
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == page.count("<svg") >= 5  # two timelines, categories, estimates, batch fit
    for svg in svgs:
        assert ElementTree.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"  # well-formed after id prefixing
    for tag in ("<script", "<img", "<link", "<iframe", "<object", "<embed"):
        assert tag not in page.lower()


class _Refs(HTMLParser):
    """Every reference the browser would follow: src/href attributes of real tags, and url()
    and @import in style sheets and style attributes (escaped text in cells is not a tag)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        for name, value in attrs:
            if name.endswith("src") or name.endswith("href") or name in ("data", "srcset", "poster", "action"):
                self.refs.append(value or "")
            if name == "style":
                self.styles.append(value or "")
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def test_the_page_loads_nothing_from_anywhere_else(page):
    found = _Refs()
    found.feed(page)
    assert len(found.refs) > 20, "the charts refer to their own markers, the nav to its sections"
    assert all(r.startswith("#") for r in found.refs), [r for r in found.refs if not r.startswith("#")][:5]
    css = "\n".join(found.styles)
    assert "body{" in css and "@import" not in css
    assert all(u.startswith("#") for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", css + page, flags=re.I))
    assert not re.search(r"(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", page, flags=re.I)
    assert "@import" not in page


def test_every_id_in_the_page_is_unique_across_charts(page):
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) > 50 and len(ids) == len(set(ids))


def test_both_ranks_have_a_memory_chart_and_the_oom_and_profiling_window_are_marked(page):
    charts = re.findall(r"<figure>(<svg.*?</svg>)\s*<figcaption>(.*?)</figcaption>", page, flags=re.S)
    by_caption = {caption.split(":")[0]: svg for svg, caption in charts}
    rank0, rank1 = by_caption["rank 0 (local 0) cuda"], by_caption["rank 1 (local 1) cuda"]
    assert "OOM fatal" in rank1 and "OOM fatal" not in rank0
    assert "profiling" in rank1 and "profiling" not in rank0
    assert "process cap" in rank1  # the cap rank 1 ran under (set_per_process_memory_fraction), from its snapshots
    assert "process cap 7.0 GiB, off scale" in rank0  # the demo caps both ranks


def test_the_oom_of_rank_1_shows_its_leak_diagnosis_outcome_and_remedies(page):
    text = _without_svg(page)
    assert re.search(r"<h3>OOM #1: rank 1 \(local 1\) cuda:0, step 1980, [^<]*<span class=\"fatal\">FATAL</span>", text)
    assert "<b>cause: leak</b>" in text and "rose by 176.00 MiB (8.00 MiB a step)" in text
    assert "<li>Do not keep tensors alive across steps, above all not ones that carry their autograd graph" in text
    assert "<summary>stack (11 frames)</summary>" in text


def test_the_category_breakdown_has_a_bar_per_rank_and_one_at_the_oom(page):
    assert "<td>rank 0 cuda:0</td><td class=num>128.06 MiB</td>" in page
    assert "<td>rank 1 cuda:0 at OOM #1</td>" in page


def test_the_top_operator_tables_list_the_profile_by_memory_and_by_time(page):
    text = _without_svg(page)
    assert "request req-7: steps 1001 to 1005" in text
    assert "<td>aten::mm</td><td class=num>120</td><td class=num>3.00 GiB</td>" in text
    assert "<td>aten::addmm</td><td class=num>240</td><td class=num>0 B</td><td class=num>9.000 ms</td>" in text
    assert "<td>other</td><td class=num>40</td><td class=num>-256.00 MiB</td>" in text
    assert "<code>req-7.trace.json.gz</code>" in text


def test_a_memory_only_profile_says_cuda_time_was_not_traced(page):
    text = _without_svg(page)
    mem = text[text.index("request mem-1") :]
    mem = mem[: mem.find("<h3", 1) if "<h3" in mem[1:] else len(mem)]
    assert "By self CUDA memory" in mem and "A memory-only window: CUDA time was not traced." in mem
    assert "By self CUDA time" not in mem
    req7 = text[text.index("request req-7") :]
    assert "By self CUDA time" in req7[: req7.find("<h3", 1)]


def test_the_remedy_estimates_are_shown_with_their_assumptions_and_compile_is_measured(page):
    text = _without_svg(page)
    assert "What a remedy would save at this OOM (estimates)" in text
    assert "fix the leak first" in text  # the OOM was a leak: estimates are not judged
    assert re.search(r"<td>activation checkpointing</td><td class=num>2.13 GiB</td><td class=num>4.85 GiB</td>", text)
    assert "about 1/√16 = 25% of the activations stay" in text
    assert "<td>torch.compile</td><td class=num>measure it</td><td class=num>not estimated</td>" in text
    assert "rank 0 cuda:0, latest breakdown" in text and "the peak fits" in text


def test_the_leak_finding_and_the_batch_advice_are_shown(page):
    text = _without_svg(page)
    assert "<td>train.py:42 in step</td>" in text and "<td class=num>5.00 GiB</td>" in text
    assert "Largest batch that keeps 10.0 % of 8.00 GiB free: <b>96</b>" in text
    assert "largest batch that fits" in page  # the fit chart's legend


def test_strings_from_the_spool_are_escaped(page):
    assert EVIL_OP not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page


def test_a_tape_replayed_at_full_speed_still_renders(tmp_path):
    spool = str(tmp_path / "spool")
    tape.replay(TAPE, spool, speed=1e6, sleep=lambda s: None)  # every time collapses to one instant
    out = str(tmp_path / "r.html")
    assert cli.main(["report", "--html", out, spool]) == 0
    with open(out) as fh:
        assert fh.read().count("<svg") >= 3


def test_an_empty_spool_renders_a_page_that_says_so(tmp_path):
    (tmp_path / "spool").mkdir()
    out = str(tmp_path / "r.html")
    assert cli.main(["report", "--html", out, str(tmp_path / "spool")]) == 0
    with open(out) as fh:
        text = fh.read()
    assert "No process wrote data" in text and "No timelines in the spool." in text


def test_a_chart_that_cannot_be_drawn_becomes_a_note_not_a_failure(caplog):
    r = report_html.Report("s", SpoolState([], [], {}, True), None, {}, 0.0, 0.0)  # type: ignore[arg-type]

    def broken(chart_id: str) -> str:
        raise ValueError("Axis limits cannot be NaN or Inf")

    assert r.chart(broken) == '<p class="note">chart not drawn: Axis limits cannot be NaN or Inf</p>'
    assert "could not be drawn" in caplog.text


def test_timeline_rows_that_are_not_numbers_are_skipped_and_unsafe_ids_never_read(tmp_path):
    rows = [[10.0, 1, [[0, 1, 2, 3], [0, "x", 2, 3], "junk"]], ["t", 1, [[0, 1, 2, 3]]], [11.0, 2, [[0, 4, 5, 6]]]]
    segments = timeline._segments(rows, 10.0)
    assert segments[0].seconds == [0.0, 1.0] and segments[0].allocated_bytes == [1.0, 4.0]
    evil = {"process": {"id": "../../etc/passwd"}}
    assert timeline.read_all(str(tmp_path), [evil]) == {}  # type: ignore[list-item]


def test_long_timelines_are_drawn_as_interval_maxima():
    xs, ys = chart.envelope(list(range(1000)), [i % 7 for i in range(1000)], max_points=100)
    assert len(xs) == 100 and max(ys) == 6 and xs[-1] == 999


def test_without_matplotlib_the_html_report_fails_with_one_line_and_the_text_report_works(tmp_path):
    spool = str(tmp_path / "spool")
    tape.replay(TAPE, spool, speed=1e6, sleep=lambda s: None)
    out = str(tmp_path / "r.html")
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from oomsight.tools.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "exporter")}
    argv = [sys.executable, "-c", code, "report", "--html", out, spool]
    html_run = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert html_run.returncode == 2 and not os.path.exists(out)  # what it needs is not installed (docs/cli.md)
    assert html_run.stderr.strip().splitlines() == [
        "oomsight report --html needs matplotlib: pip install 'oomsight[report]'"
    ]
    text_run = subprocess.run([sys.executable, "-c", code, "report", spool], capture_output=True, text=True, env=env)
    assert text_run.returncode == 0 and "cause: leak" in text_run.stdout


def test_only_the_html_report_imports_matplotlib():
    code = (
        "import sys\n"
        "import oomsight.tools.cli, oomsight.tools.report, oomsight.analysis.advice\n"
        "import oomsight.analysis.timeline, oomsight.hook.runtime, oomsight.metrics.collector\n"
        "assert 'matplotlib' not in sys.modules, 'imported early'\n"
        "import oomsight.tools.report_html\n"
        "assert 'matplotlib' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "exporter")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr


def test_hostile_strings_cannot_break_the_page_and_mistyped_fields_are_a_counted_skip(tmp_path):
    spool = str(tmp_path / "spool")
    tape.replay(TAPE, spool, speed=1e6, sleep=lambda s: None)
    (name,) = os.listdir(os.path.join(spool, "events"))
    path = os.path.join(spool, "events", name)
    with open(path) as fh:
        event = json.load(fh)
    event.update(allocator_summary="</pre><script>x()</script>")
    event["diagnosis"]["summary"] = "<b onclick=x()>bold</b>"
    write_atomic(path, json.dumps(event).encode(), durable=True)
    out = str(tmp_path / "r.html")
    assert cli.main(["report", "--html", out, spool]) == 0
    with open(out) as fh:
        text = fh.read()
    assert "<script" not in text and "<b onclick" not in text
    assert "&lt;b onclick=x()&gt;bold&lt;/b&gt;" in text
    # every key is in the field table now: a mistyped one makes the event invalid, not the page
    event.update(stack=5, reserved_unallocated_bytes="lots")
    write_atomic(path, json.dumps(event).encode(), durable=True)
    state = SpoolReader(spool).read()
    assert state.events == [] and state.skipped_total["invalid"] == 1
    assert cli.main(["report", "--html", out, spool]) == 0


PAGE = "<!doctype html><p>a page</p>"


def test_html_to_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    """Issue 36: the page was written to a temp file renamed over the link, replacing it."""
    target, link = tmp_path / "real.html", tmp_path / "link.html"
    target.write_text("old")
    link.symlink_to(target)
    report_html.write(str(link), PAGE)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == PAGE


def test_html_to_a_fifo_is_written_through_and_the_fifo_stays(tmp_path):
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))  # noqa: SIM115
    reader.start()
    report_html.write(str(fifo), PAGE)
    reader.join(timeout=10)
    assert got == [PAGE.encode()] and os.path.exists(fifo)
    import stat

    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_html_to_dev_null_writes_through_and_to_a_full_device_fails_in_one_line(tmp_path, capsys):
    import stat

    report_html.write(os.devnull, PAGE)
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)  # still the device, never a plain file
    spool = str(tmp_path / "spool")
    os.makedirs(os.path.join(spool, "snapshots"))
    assert cli.main(["report", "--html", "/dev/full", spool]) == 1  # exitcode.REFUSED
    err = capsys.readouterr().err
    assert "cannot write /dev/full" in err and "wrote" not in err and len(err.strip().splitlines()) == 1
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    assert cli.main(["report", "--html", str(tmp_path), spool]) == 1  # a folder: refused, not replaced
    assert os.path.isdir(tmp_path)


def test_html_to_dash_goes_to_standard_output(capsysbinary):
    report_html.write("-", PAGE)
    assert capsysbinary.readouterr().out == PAGE.encode()


def test_html_to_a_regular_file_is_replaced_atomically(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    before = os.stat(out).st_ino
    report_html.write(str(out), PAGE)
    assert out.read_text() == PAGE and os.stat(out).st_ino != before  # a new file renamed into place
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temp file left
