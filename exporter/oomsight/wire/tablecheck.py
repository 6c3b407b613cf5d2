"""One table's checks as one generated function (``oomsight.wire.schema`` uses it first).

A key at a time through the table costs a loop step, a tuple unpacking and a function call per
key; a publish changes a few dozen scalars across half a dozen tables, and a scrape of a
thousand ranks checks them all. :func:`compile_table` writes, once per table, a function that
checks each key inline, in the table's order:

- the scalars as ``oomsight.wire.schema``'s tests do (ints within ±2**63, numbers finite, times
  within ±2**33, text, choices);
- a nested object, list or map equal to its counterpart in the known earlier version: taken from
  there (checked then);
- a nested object, or each object of a list, by its table's generated check, and where that does
  not pass or the object has keys the table lacks, by the schema's check of its table (which
  raises with the path); a list of rows as one; other nested values by the schema's own nested
  check;
- an absent optional key filled with its default when asked.

At the first scalar it does not pass it returns False, and the schema checks the document key by
key, which says what is wrong. The source is made from the table alone (its names are
``repr``'d), never from a document.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from oomsight.wire.fieldtypes import Field, Table, default_of

Check = Callable[[dict[str, Any], str, bool, Any], bool]
"""(document, where, fill defaults, the known earlier version) -> every key passed."""

_RETURN = "return False"
_TESTS = {
    "int": ["if type(v) is not int or not LO <= v <= HI:", f"    {_RETURN}"],
    # a float minus itself is 0.0 unless it is infinite or NaN
    "number": [
        "if type(v) is float:",
        "    if v - v != 0.0:",
        f"        {_RETURN}",
        "elif type(v) is not int or not LO <= v <= HI:",
        f"    {_RETURN}",
    ],
    # a NaN is within no range
    "time": ["if type(v) is not float and type(v) is not int or not -TMAX <= v <= TMAX:", f"    {_RETURN}"],
    "str": ["if type(v) is not str or not (v.isascii() or TEXT(v)):", f"    {_RETURN}"],
    "bool": ["if type(v) is not bool:", f"    {_RETURN}"],
    "any": ["if not JSON(v):", f"    {_RETURN}"],
}


def compile_table(table: Table, env: dict[str, Any]) -> Check:
    """The check of ``table``. ``env`` gives ``A`` (the absent marker), ``LO``/``HI`` (the int
    range), ``TMAX`` (the time range), ``TEXT`` (a string is text), ``JSON`` (any JSON within
    bounds), ``NESTED(doc, name, field, value, where, fill, known)`` (a nested value's check),
    ``OBJECT(value, table, where, fill, known)`` (a nested object's check, which says what is
    wrong), ``TABLE(table)`` (a nested table's key names and generated check) and ``ROWS(list)``
    (every item a row of finite numbers)."""
    scope = dict(env)
    lines = ["def check(doc, where, fill, known):", "    get = doc.get"]
    for i, f in enumerate(table.fields):
        scope[f"F{i}"], scope[f"D{i}"], scope[f"C{i}"] = f, functools.partial(default_of, f), frozenset(f.choices)
        if f.kind in ("object", "list") and f.table is not None:
            scope[f"NAMES{i}"], scope[f"CHECK{i}"] = env["TABLE"](f.table)
        name = repr(f.name)
        lines += [f"    v = get({name}, A)", "    if v is A:"]
        lines += [f"        {_RETURN}"] if f.required else ["        if fill:", f"            doc[{name}] = D{i}()"]
        lines += ["    elif v is None:", "        pass" if f.nullable else f"        {_RETURN}", "    else:"]
        lines += ["        " + line for line in _test(f, i, name)]
    lines.append("    return True")
    exec(compile("\n".join(lines), f"<oomsight check of {table.name}>", "exec"), scope)
    return scope["check"]  # type: ignore[no-any-return]


def _test(f: Field, i: int, name: str) -> list[str]:
    if f.kind == "str" and f.choices:
        return [f"if type(v) is not str or v not in C{i}:", f"    {_RETURN}"]
    if f.kind in _TESTS and not f.choices:
        return _TESTS[f.kind]
    nested = [f"NESTED(doc, {name}, F{i}, v, where, fill, known)"]
    if f.kind not in _SHAREABLE or f.choices:
        return nested  # other choices
    # an object, list or map equal to its counterpart in the known version is that one, already
    # checked (a publish changes a few); an object that is not is checked by the schema's check
    # of its table, and is the known one if equal once its defaults are filled
    kind = _SHAREABLE[f.kind]
    lines = [
        "k = known.get(" + name + ") if known is not None else None",
        f"if type(v) is {kind} and type(k) is {kind} and k == v:",
    ]
    lines += [f"    doc[{name}] = k"]
    at = f"where + {'.' + f.name!r}"
    if f.kind == "list" and f.items == "row":  # hundreds of rows, checked as one
        return [*lines, "elif type(v) is list and ROWS(v):", "    pass", "else:", "    " + nested[0]]
    if f.kind == "list" and f.table is not None:  # a list of objects: each by its table's check
        return [
            *lines,
            "elif type(v) is list:",
            "    olds = k if type(k) is list and len(k) == len(v) else None",
            "    for j, item in enumerate(v):",
            "        if type(item) is not dict:",
            f"            {_RETURN}",
            "        k = olds[j] if olds is not None and type(olds[j]) is dict else None",
            *["        " + line for line in _by_table(i, "item", f"{at} + '[' + str(j) + ']'")],
            "else:",
            f"    {_RETURN}",
        ]
    if f.kind != "object":
        return [*lines, "else:", "    " + nested[0]]
    return [
        *lines,
        "elif type(v) is dict:",
        "    k = k if type(k) is dict else None",
        *["    " + line for line in _by_table(i, "v", at)],
        "    if k is not None and k == v:",
        f"        doc[{name}] = k",
        "else:",
        f"    {_RETURN}",
    ]


def _by_table(i: int, value: str, at: str) -> list[str]:
    """The check of the object ``value`` (at the path ``at``, against the known ``k``) by field
    ``i``'s table: its generated check, and where that does not pass or the object has keys the
    table lacks, the schema's check of the table, which says what is wrong."""
    return [
        f"if not (CHECK{i}({value}, {at}, fill, k) and NAMES{i}.issuperset({value})):",
        f"    OBJECT({value}, F{i}.table, {at}, fill, k)",
    ]


_SHAREABLE = {"object": "dict", "map": "dict", "list": "list"}
