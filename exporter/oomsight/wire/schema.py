"""Validation of the spool's documents (version 1), read off the one field table.

The hook writes these as JSON; the sidecar and ``oomsight report`` read them back.
``oomsight.wire.fields`` is the table: every key, its type, whether readers need it, and
its revision; ``oomsight.wire.documents`` holds the ``TypedDict`` s generated from it (this
module re-exports them) and ``docs/spool-format.md`` and ``docs/spool-schema.json`` are its
prose and JSON Schema versions. Readers accept unknown extra keys (a newer writer of the same
version stays readable), see the table's default for a missing optional key, and reject a
document that lacks a required key or has one of the wrong type or out of range.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Callable, Optional

from oomsight.wire.documents import (
    AllocatorSample,
    BatchAdvice,
    Categories,
    DeviceSnapshot,
    Diagnosis,
    JobSetup,
    LeakFinding,
    ModelStates,
    NvmlSample,
    OomEvent,
    PeakPrediction,
    ProcessInfo,
    Profile,
    ProfileOp,
    ProfileRequestDocument,
    Snapshot,
    StepInfo,
    StepPeak,
    StepTrend,
)
from oomsight.wire.fields import DOCUMENTS
from oomsight.wire.fieldtypes import LABEL_MAX_CHARS, Field, Table, default_of

__all__ = [
    "AllocatorSample",
    "BatchAdvice",
    "Categories",
    "DeviceSnapshot",
    "Diagnosis",
    "JobSetup",
    "LeakFinding",
    "ModelStates",
    "NvmlSample",
    "OomEvent",
    "PeakPrediction",
    "ProcessInfo",
    "Profile",
    "ProfileOp",
    "ProfileRequestDocument",
    "SchemaError",
    "Snapshot",
    "StepInfo",
    "StepPeak",
    "StepTrend",
    "default_of",
    "validate",
]

SCHEMA_VERSION = 1
KIND_SNAPSHOT = "snapshot"
KIND_OOM_EVENT = "oom_event"
KIND_PROFILE = "profile"
KINDS = (KIND_SNAPSHOT, KIND_OOM_EVENT, KIND_PROFILE)

OUTCOME_PENDING = "pending"
OUTCOME_RECOVERED = "recovered"
OUTCOME_FATAL = "fatal"
OUTCOMES = (OUTCOME_PENDING, OUTCOME_RECOVERED, OUTCOME_FATAL)

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
"""Integers outside a signed 64-bit range are not ours (and overflow float conversions)."""
TIME_MAX = 2.0**33
"""A time is within ±2**33 Unix seconds (years 1697 to 2242): finite, and one datetime can show."""


class SchemaError(ValueError):
    """A document does not have the shape of its declared kind and version."""


def _is_int(v: Any) -> bool:
    return type(v) is int and INT_MIN <= v <= INT_MAX


def _is_number(v: Any) -> bool:
    return _is_int(v) if type(v) is int else type(v) is float and math.isfinite(v)


def _is_text(v: Any) -> bool:
    if type(v) is not str:
        return False
    if v.isascii():
        return True
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


MAX_JSON_DEPTH = 32
"""How deep a value the table does not describe may nest (an ``any`` value, a newer writer's key):
readers may recurse into what they keep, and our own documents nest 5 deep."""


def _is_json(v: Any) -> bool:
    """Any JSON value nested at most ``MAX_JSON_DEPTH`` deep whose numbers are in range and whose
    strings are text (walked, not recursed)."""
    stack = [(v, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict or type(item) is list:
            if depth >= MAX_JSON_DEPTH:
                return False
            if type(item) is dict:
                if not all(_is_text(k) for k in item):
                    return False
                stack.extend((x, depth + 1) for x in item.values())
            else:
                stack.extend((x, depth + 1) for x in item)
        elif not (item is None or type(item) is bool or _is_number(item) or _is_text(item)):
            return False
    return True


_ROW_TYPES = frozenset((int, float, bool))
_LIST = frozenset((list,))


def _is_row(v: Any) -> bool:
    """A list of booleans and numbers; the hook writes hundreds a snapshot, so the usual row
    (every int within ``INT_MIN..INT_MAX``, every float finite) is checked in C passes, and only
    a row that fails them is checked item by item. A float sum is finite only when every float
    in it is (an infinity or NaN stays one whatever is added), and an int beyond float range
    cannot be added to a float: both fall to the item-by-item check."""
    if type(v) is not list:
        return False
    if not v:
        return True
    if not _ROW_TYPES.issuperset(map(type, v)):
        return False
    try:
        if min(v) >= INT_MIN and max(v) <= INT_MAX and math.isfinite(sum(v)):
            return True
    except OverflowError:  # an int beyond float range
        pass
    return all(type(x) is bool or _is_number(x) for x in v)


def _are_rows(value: list[Any]) -> bool:
    """Every item a row, checked as one row (hundreds of rows a snapshot)."""
    return _LIST.issuperset(map(type, value)) and _is_row(list(chain.from_iterable(value)))


_SCALARS = {
    "int": _is_int,
    "number": _is_number,
    "time": lambda v: _is_number(v) and -TIME_MAX <= v <= TIME_MAX,
    "str": _is_text,
    "bool": lambda v: type(v) is bool,
    "any": _is_json,
    "row": _is_row,
}


def _is_label(v: Any) -> bool:
    return _is_text(v) and len(v) <= LABEL_MAX_CHARS


def _scalar(f: Field, kind: str) -> Callable[[Any], bool]:
    """The test a value of ``kind`` (the field's own, or its items') passes, with the field's bounds: a counter's
    number is >= 0, a label's string at most :data:`LABEL_MAX_CHARS` characters (issue 44)."""
    if f.counter and kind in ("int", "number"):
        test = _SCALARS[kind]
        return lambda v: test(v) and v >= 0
    if f.label and kind == "str":
        return _is_label
    return _SCALARS[kind]


def _bound(f: Field) -> str:
    """What a value of ``f`` must be besides its kind, for the message of a refusal."""
    if f.counter:
        return " (a counter: >= 0)"
    return f" (a label value: at most {LABEL_MAX_CHARS} characters)" if f.label else ""


def _check_value(f: Field, value: Any, where: str, fill: bool, known: Any = None) -> None:
    if f.kind == "object":
        assert f.table is not None
        _check(value, f.table, where, fill, known if type(known) is dict else None)
    elif f.kind == "list":
        if type(value) is not list:
            raise SchemaError(f"{where} is not a list")
        if f.items == "row" and _are_rows(value):
            return  # hundreds of rows a snapshot: checked as one; a bad one is found below
        olds = known if type(known) is list and len(known) == len(value) else None
        for i, item in enumerate(value):
            if f.table is not None:
                _check(item, f.table, f"{where}[{i}]", fill, olds[i] if olds is not None else None)
            elif not _scalar(f, f.items or "any")(item):
                raise SchemaError(f"{where}[{i}] is not {f.items}{_bound(f)}")
    elif f.kind == "map":
        if type(value) is not dict:
            raise SchemaError(f"{where} is not an object")
        check, key = _scalar(f, f.items or "any"), _is_label if f.label else _is_text
        if not all(check(v) and key(k) for k, v in value.items()):
            raise SchemaError(f"{where} holds a value that is not {f.items} or a key that is not text{_bound(f)}")
    elif not _scalar(f, f.kind)(value):
        raise SchemaError(f"{where} is not {f.kind}{_bound(f)}")
    elif f.choices and value not in f.choices:
        raise SchemaError(f"{where} {value!r} is not one of {f.choices}")


def _check(doc: Any, table: Table, where: str, fill: bool, known: Optional[dict[str, Any]] = None) -> None:
    """``known``: the same object of a document validated before (with defaults filled when
    ``fill``); a nested object or list equal to its counterpart there is that one, already
    checked, so it is taken instead of checked again (a publish changes a few counters)."""
    if type(doc) is not dict:
        raise SchemaError(f"{where} is not an object")
    plan, names = _planned(table)
    for name, f, fits in plan:
        value = doc.get(name, _ABSENT)
        if value is _ABSENT:
            if f.required:
                raise SchemaError(f"{where}.{name} is missing")
            if fill:
                doc[name] = default_of(f)
        elif value is None:
            if not f.nullable:
                raise SchemaError(f"{where}.{name} is null")
        elif fits is None or not fits(value):
            _check_nested(doc, name, f, value, where, fill, known)
    if not names.issuperset(doc):  # a newer writer's keys: any JSON, within bounds
        for name, value in list(doc.items()):
            if name in names:
                continue
            before = known.get(name, _ABSENT) if known is not None else _ABSENT
            if before is not _ABSENT and type(before) is type(value) and before == value:
                doc[name] = before
            elif not (_is_text(name) and _is_json(value)):
                raise SchemaError(f"{where}.{name} is not text or JSON nested at most {MAX_JSON_DEPTH} deep")


def _check_nested(
    doc: dict[str, Any], name: str, f: Field, value: Any, where: str, fill: bool, known: Optional[dict[str, Any]]
) -> None:
    """A value no scalar test passed: nested, or wrong (raises with its path). One equal to its
    counterpart in ``known`` becomes that one."""
    before = known.get(name) if known is not None else None
    shared = before is not None and type(before) is type(value) and type(value) in _SHARED
    if shared and before == value:
        doc[name] = before
        return
    _check_value(f, value, f"{where}.{name}", fill, before)
    if shared and f.kind == "object" and before == value:  # equal once its defaults are filled
        doc[name] = before


_SHARED = frozenset((dict, list))


Plan = tuple[tuple[str, Field, Optional[Callable[[Any], bool]]], ...]
_PLANS: dict[int, tuple[Table, Plan, frozenset[str]]] = {}


def _planned(table: Table) -> tuple[Plan, frozenset[str]]:
    """Each field of ``table`` with, for a scalar without choices, the test a value must pass
    (a value that fails it goes to ``_check_value``, which says why), and the table's key names;
    made once per table."""
    found = _PLANS.get(id(table))
    if found is None or found[0] is not table:
        plan = tuple(
            (f.name, f, _scalar(f, f.kind) if f.kind in _SCALARS and not f.choices else None) for f in table.fields
        )
        found = _PLANS[id(table)] = (table, plan, frozenset(f.name for f in table.fields))
    return found[1], found[2]


_ABSENT = object()


def validate(doc: Any, fill_defaults: bool = False, known: Any = None) -> str:
    """Check a parsed document against its kind's table; return its kind. Raise
    :class:`SchemaError` otherwise. ``fill_defaults`` sets every absent optional key to the
    table's default, so readers can index any key of the table. ``known``: an earlier document
    of the same kind that passed with the same ``fill_defaults`` (the file's previous version):
    the parts of ``doc`` equal to its parts become those, checked once."""
    if type(doc) is not dict or not _is_text(doc.get("kind")):
        raise SchemaError("document has no kind")
    kind = doc["kind"]
    table = DOCUMENTS.get(kind)
    if table is None:
        raise SchemaError(f"unknown kind {kind!r}")
    _check(doc, table, kind, fill_defaults, known if type(known) is dict and known.get("kind") == kind else None)
    return str(kind)
