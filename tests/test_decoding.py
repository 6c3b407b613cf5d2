"""Reading a spool file nobody vouches for (``oomsight.wire.decoding``), with the standard library's
parser alone (issue 25): every JSON value reads as ``json.loads`` reads it or is skipped with a reason,
never a traceback; a damaged snapshot is skipped or read; symbolic links, FIFOs, oversized files, JSON
nested too deep, non-finite numbers and lone surrogates never reach the reader's documents."""

import json
import math
import os
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire import decoding
from oomsight.wire.schema import SchemaError, validate

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff", "\x00", '"', "\\"]))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)
ODD = [b"NaN", b"1e400", b"9" * 25, b"\\ud800", b"\xef\xbb\xbf", b"-", b"."]


def outcome(raw):
    try:
        return "ok", decoding.decode(raw)
    except decoding.Unusable as exc:
        return exc.reason, exc.detail


def has_lone_surrogate(value):
    return "\\ud8" in json.dumps(value).lower() or "\\udf" in json.dumps(value).lower()


@settings(max_examples=800, deadline=None)
@given(values, st.booleans())
def test_any_json_value_reads_as_json_reads_it_unless_it_holds_a_lone_surrogate(value, ascii_only):
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    reason, found = outcome(raw)
    if reason == "ok":
        assert repr(found) == repr(json.loads(raw.decode("utf-8")))
    else:
        assert reason == "corrupt" and has_lone_surrogate(value), (reason, found)


def snapshots():
    _, records = tape.read(TAPE)
    return [json.dumps(r["doc"]).encode() for r in records[-6:]]


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(snapshots()), st.data())
def test_a_damaged_snapshot_is_skipped_with_a_reason_or_read_and_validated_without_a_traceback(raw, data):
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    cut = data.draw(st.integers(min_value=0, max_value=3))
    put = data.draw(st.binary(max_size=4) | st.sampled_from(ODD))
    reason, found = outcome(raw[:at] + put + raw[at + cut :])
    if reason != "ok":
        assert reason == "corrupt"
        return
    try:
        validate(found, fill_defaults=True)
    except SchemaError:
        return
    numbers = [x for x in _leaves(found) if isinstance(x, float)]
    assert all(math.isfinite(x) for x in numbers)  # validation keeps no NaN or infinity


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_every_shipped_document_reads(tmp_path):
    for raw in snapshots():
        assert outcome(raw)[0] == "ok"


def test_json_nested_past_the_bound_is_corrupt_before_the_parser_sees_it():
    assert outcome(b"[" * 33 + b"]" * 33)[0] == "corrupt"
    assert outcome(b"[" * 32 + b"]" * 32)[0] == "ok"
    assert outcome(b"[" * 100_000 + b"]" * 100_000)[0] == "corrupt"


def test_a_symlink_a_fifo_and_an_oversized_file_are_refused_on_the_open_descriptor(tmp_path):
    target = tmp_path / "real.json"
    target.write_bytes(b"{}")
    os.symlink(target, tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "big.json").write_bytes(b" " * 2048)
    found = {}

    def read_all():
        for name in ("link.json", "fifo.json", "big.json"):
            try:
                decoding.load(str(tmp_path / name), max_bytes=1024)
            except decoding.Unusable as exc:
                found[name] = exc.reason

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(timeout=10)  # a FIFO opened for reading without O_NONBLOCK would hang here
    assert found == {"link.json": "foreign", "fifo.json": "foreign", "big.json": "oversized"}
