"""The generated table checks (``oomsight.wire.tablecheck``) decide as the key-by-key check does:
every scalar of real documents replaced by hostile values, and every key removed, gives the
same verdict, the same error and the same document either way."""

import copy
import json
import math

import pytest

from oomsight.tools import tape
from oomsight.tools.demo import TAPE
from oomsight.wire import schema
from oomsight.wire.schema import SchemaError, validate

HOSTILE = (
    None, True, False, 0, -1, 2**63 - 1, 2**63, -(2**63) - 1, 2**33, -(2**33) - 1, 10**400, 0.5, -0.0,
    1e300, math.inf, -math.inf, math.nan, 2.0**33 + 1, "", "running", "é", "\ud800", [], {}, [1, "x"], {"a": 1},
)  # fmt: skip


def documents():
    _, records = tape.read(TAPE)
    kinds, out = set(), []
    for r in reversed(records):  # the last of each kind, and a pending OOM event
        key = (r["doc"]["kind"], r["doc"].get("outcome"))
        if key not in kinds:
            kinds.add(key)
            out.append(shortened(r["doc"]))
    return out


def shortened(value):
    """``value`` with every list cut to its first two items (the checks treat items alike)."""
    if isinstance(value, dict):
        return {k: shortened(v) for k, v in value.items()}
    return [shortened(v) for v in value[:2]] if isinstance(value, list) else value


def paths(value, at=()):
    """Every key path of ``value`` down to its scalars (of a list, its first item alone)."""
    items = value.items() if isinstance(value, dict) else enumerate(value[:1]) if isinstance(value, list) else ()
    for key, item in items:
        yield (*at, key)
        yield from paths(item, (*at, key))


def verdict(doc, known, generated):
    """What validation says of ``doc`` with the generated checks or with keys checked in turn."""
    saved = dict(schema._PLANS)
    if not generated:
        for key, (table, plan, names, _) in saved.items():
            schema._PLANS[key] = (table, plan, names, lambda *args: False)
    try:
        return "ok", validate(doc, fill_defaults=True, known=known), doc
    except SchemaError as exc:
        return "invalid", str(exc), None
    finally:
        schema._PLANS.clear()
        schema._PLANS.update(saved)


def replaced(doc, path, value):
    out = copy.deepcopy(doc)
    holder = out
    for key in path[:-1]:
        holder = holder[key]
    if value is KeyError:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return out


@pytest.mark.parametrize("doc", documents(), ids=lambda d: d["kind"])
def test_a_generated_check_decides_as_the_key_by_key_check_on_every_hostile_value(doc):
    known = json.loads(json.dumps(doc))
    validate(known, fill_defaults=True)
    tried = 0
    for path in paths(doc):
        for value in (*HOSTILE, KeyError):
            bad = replaced(doc, path, value)
            for before in (None, known):
                got = verdict(copy.deepcopy(bad), before, True)
                want = verdict(copy.deepcopy(bad), before, False)
                assert repr(got) == repr(want), (path, value)  # repr: NaN equals nothing
                tried += 1
    assert tried > 1000


def deep(levels):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


UNKNOWN = (1, "x", [1, {"a": None}], deep(schema.MAX_JSON_DEPTH + 5), math.nan, 2**64, "\ud800", {"\ud800": 1})


@pytest.mark.parametrize("doc", documents(), ids=lambda d: d["kind"])
def test_a_key_a_newer_writer_added_to_any_object_is_checked_alike_by_either_check(doc):
    """An unknown key is any JSON within bounds, at the top or in a nested object: a deeply
    nested, non-finite, huge or non-Unicode value there makes the document invalid either way."""
    known = json.loads(json.dumps(doc))
    validate(known, fill_defaults=True)
    tried = 0
    objects = [()] + [p for p in paths(doc) if isinstance(lookup(doc, p), dict)]
    # a table's object, not a map (whose values are of one kind)
    tables = [p for p in objects if all(verdict(added(doc, p, v), None, False)[0] == "ok" for v in UNKNOWN[:3])]
    assert len(tables) > 3
    for path in tables:
        for value in UNKNOWN:
            newer = added(doc, path, value)
            for before in (None, known):
                got = verdict(copy.deepcopy(newer), before, True)
                assert repr(got) == repr(verdict(copy.deepcopy(newer), before, False)), (path, value)
                assert (got[0] == "ok") == (value in UNKNOWN[:3]), (path, value)
                tried += 1
    assert tried > 100


def added(doc, path, value):
    newer = copy.deepcopy(doc)
    lookup(newer, path)["added_by_a_newer_writer"] = value
    return newer


def lookup(doc, path):
    for key in path:
        doc = doc[key]
    return doc
