"""A spool file reads the same whether orjson or json parses it (``oomsight.wire.decoding``):
the same value, or the same reason to skip it."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire import decoding

pytestmark = pytest.mark.skipif(decoding._orjson is None, reason="orjson is not installed")


def outcome(raw, parser):
    saved = decoding._orjson
    decoding._orjson = parser
    try:
        return "ok", repr(decoding.decode(raw, max_depth=None))  # repr: NaN equals nothing
    except decoding.Unusable as exc:
        return exc.reason, exc.detail
    finally:
        decoding._orjson = saved


def same_either_way(raw):
    with_orjson = outcome(raw, decoding._orjson)
    assert with_orjson == outcome(raw, None), raw[:200]
    return with_orjson


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, 10**19 - 1, 10**19])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff", "\x00", '"', "\\"]))
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)
ODD = [b"NaN", b"1e400", b"9" * 25, b"\\ud800", b"\xef\xbb\xbf", b"-", b"."]


@settings(max_examples=1500, deadline=None)
@given(values, st.booleans())
def test_any_json_value_reads_the_same_with_either_parser(value, ascii_only):
    same_either_way(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


def snapshots():
    _, records = tape.read(TAPE)
    return [json.dumps(r["doc"]).encode() for r in records[-6:]]


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(snapshots()), st.data())
def test_a_damaged_snapshot_reads_the_same_with_either_parser(raw, data):
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    cut = data.draw(st.integers(min_value=0, max_value=3))
    put = data.draw(st.binary(max_size=4) | st.sampled_from(ODD))
    same_either_way(raw[:at] + put + raw[at + cut :])


def test_every_shipped_document_reads_the_same_and_is_parsed_by_orjson(monkeypatch):
    for raw in snapshots():
        assert same_either_way(raw)[0] == "ok"
    parsed = []
    real = decoding._orjson

    class Spy:
        JSONDecodeError = real.JSONDecodeError

        @staticmethod
        def loads(raw):
            parsed.append(1)
            return real.loads(raw)

    monkeypatch.setattr(decoding, "_orjson", Spy)
    decoding.decode(snapshots()[-1])
    assert parsed == [1]
