"""The one field table: validation, TypedDicts, JSON Schema and docs all come from it, and a
newer reader reads the shipped H200 tape (an older writer) whatever keys writers add later."""

import copy
import json
import os

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire import documents, rendering, schema
from oomsight.wire.fields import DOCUMENTS, tables
from oomsight.wire.fieldtypes import BASE
from oomsight.wire.schema import SchemaError, default_of, validate
from oomsight.wire.spool import SpoolReader, write_atomic


def tape_docs():
    _, records = tape.read(TAPE)
    return [(r["path"], r["doc"]) for r in records]


def spool_of(root, docs):
    for rel, doc in docs:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, json.dumps(doc).encode(), durable=False)
    return SpoolReader(root).read()


def test_every_typeddict_is_annotated_exactly_as_the_table_says():
    for t in tables():
        td = getattr(documents, t.name)
        written = {k: getattr(v, "__forward_arg__", v) for k, v in td.__annotations__.items()}
        assert written == {f.name: rendering.annotation(f) for f in t.fields}, t.name


def test_the_generated_module_schema_and_docs_have_not_drifted_from_the_table():
    assert rendering.drifted() == []
    assert rendering.main(["--check"]) == 0


def test_every_document_of_the_shipped_tape_validates_against_the_table():
    docs = tape_docs()
    assert len(docs) == 75
    assert {validate(copy.deepcopy(doc)) for _, doc in docs} == {"snapshot", "oom_event"}


def test_every_document_of_the_shipped_tape_validates_against_the_published_json_schema():
    with open(rendering.SCHEMA_JSON) as fh:
        schema = json.load(fh)
    validator = jsonschema.Draft202012Validator(schema)
    for _, doc in tape_docs():
        validator.validate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**doc, "time": "yesterday"})


def test_the_shipped_tape_reads_with_no_invalid_document_after_the_writer_adds_keys(tmp_path):
    docs = []
    for rel, doc in tape_docs():
        doc = copy.deepcopy(doc)
        doc["a_key_from_the_future"] = {"nested": [1, 2]}
        for device in doc.get("devices", []):
            device["allocator"]["oversize_segments"] = 3  # a new allocator key in the writer
        docs.append((rel, doc))
    state = spool_of(str(tmp_path), docs)
    assert sum(state.skipped_total.values()) == 0
    assert len(state.snapshots) == 2 and len(state.events) == 1  # two processes, their latest files


def test_a_document_with_an_unknown_extra_key_anywhere_reads(tmp_path):
    rel, doc = next(item for item in tape_docs() if item[1]["kind"] == "oom_event")
    doc = copy.deepcopy(doc)
    doc["process"]["container"] = "trainer"
    doc["diagnosis"]["confidence"] = 0.9
    doc["nvml"]["temperature_c"] = 41
    (event,) = spool_of(str(tmp_path), [(rel, doc)]).events
    assert event["process"]["container"] == "trainer"


def test_a_future_schema_version_is_a_counted_skip(tmp_path):
    rel, doc = tape_docs()[0]
    state = spool_of(str(tmp_path), [(rel, {**doc, "schema_version": 2})])
    assert state.snapshots == [] and state.skipped_total["future_version"] == 1


def test_keys_added_after_a_table_are_optional_and_tape_keys_may_be_required():
    for t in tables():
        for f in t.fields:
            if t.field_since(f) != t.since:
                assert not f.required, f"{t.name}.{f.name} came later than its table: it must be optional"
    present = _keys_in_every_tape_doc()
    for t in tables():
        if t.since == BASE and t.name in present:
            required = {f.name for f in t.fields if f.required}
            assert required <= present[t.name], t.name


def _keys_in_every_tape_doc():
    """Table name -> the keys every object of that table in the tape has."""
    found = {}

    def visit(obj, table):
        keys = set(obj)
        found[table.name] = found.get(table.name, keys) & keys
        for f in table.fields:
            value = obj.get(f.name)
            if f.table is not None and isinstance(value, dict):
                visit(value, f.table)
            elif f.table is not None and isinstance(value, list):
                for item in value:
                    visit(item, f.table)

    for _, doc in tape_docs():
        visit(doc, DOCUMENTS[doc["kind"]])
    return found


def test_every_optional_key_has_a_default_a_reader_can_use():
    for t in tables():
        for f in t.fields:
            if not f.required and not f.nullable:
                assert default_of(f) is not None, f"{t.name}.{f.name} needs a default"


def test_a_missing_optional_key_reads_as_its_default():
    _, doc = tape_docs()[1]
    doc = copy.deepcopy(doc)
    del doc["devices"][0]["nvml"], doc["process"]["world_size"], doc["sources"]
    doc["devices"][0].pop("steps_memory", None), doc.pop("job", None)
    validate(doc, fill_defaults=True)
    assert doc["devices"][0]["nvml"] is None and doc["process"]["world_size"] == 1 and doc["sources"] == {}
    assert doc["devices"][0]["steps_memory"] == [] and doc["job"] is None


@pytest.mark.parametrize(
    "path, value",
    [
        (("time",), float("nan")),
        (("time",), 1e300),
        (("seq",), 2**64),
        (("seq",), True),
        (("state",), "sleeping"),
        (("process", "id"), "\ud800"),
        (("devices", 0, "allocator", "ooms"), None),
        (("devices", 0, "trend"), [[1.0, float("inf"), 2]]),
        (("errors",), {"sampler": "many"}),
    ],
)
def test_a_value_out_of_its_range_or_type_is_invalid(path, value):
    _, doc = tape_docs()[1]
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(SchemaError):
        validate(doc)


def test_a_profile_request_is_read_off_its_table_too(tmp_path):
    from oomsight.wire.requests import parse_request, write_request

    path = write_request(str(tmp_path), "r-1", steps=3, start_step=10)
    with open(path) as fh:
        doc = json.load(fh)
    assert validate(dict(doc)) == "profile_request"
    assert parse_request({**doc, "priority": "high"}).start_step == 10  # an unknown key reads
    assert parse_request({**doc, "schema_version": 2}) is None  # a future version is not ours
    assert parse_request({**doc, "created_at": float("nan")}) is None
    assert parse_request({k: v for k, v in doc.items() if k not in ("schema_version", "cuda_time")}).cuda_time


ROW_ITEMS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -0.0, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 1e300, "1", None]),
)


@settings(max_examples=2000, deadline=None, database=None)
@given(st.lists(ROW_ITEMS, max_size=6))
def test_the_fast_row_check_accepts_exactly_what_the_item_by_item_check_does(row):
    def exact(v):
        return all(type(x) is bool or schema._is_number(x) for x in v)

    assert schema._is_row(row) == exact(row)


def test_every_counter_the_hook_reads_has_a_row_in_the_allocator_table_that_the_sampler_fills():
    from oomsight.hook.cuda import Reading
    from oomsight.wire.fields import ALLOCATOR

    rows = {f.name for f in ALLOCATOR.fields}
    assert set(Reading._fields) <= rows, "add a row to wire/fields.py ALLOCATOR for each new Reading field"
