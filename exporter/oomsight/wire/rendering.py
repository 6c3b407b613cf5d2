"""Everything written from the field table (``oomsight.wire.fields``): the ``TypedDict`` s of
``oomsight/wire/documents.py``, ``docs/spool-schema.json`` and the field lists inside
``docs/spool-format.md`` (between ``<!-- fields:Name -->`` and ``<!-- /fields -->``).

``python -m oomsight.wire.rendering`` rewrites them; ``--check`` exits 1 when one has drifted.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from collections.abc import Iterable
from typing import Any, Optional

from oomsight.wire.fields import DOCUMENTS, tables
from oomsight.wire.fieldtypes import Field, Table, default_of

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WIRE = os.path.dirname(os.path.abspath(__file__))
DOCUMENTS_PY = os.path.join(WIRE, "documents.py")
_FAMILY_FILE = re.compile(r"documents_\w+\.py")
SCHEMA_JSON = os.path.join(ROOT, "docs", "spool-schema.json")
FORMAT_MD = os.path.join(ROOT, "docs", "spool-format.md")
INT_RANGE = {"minimum": -(2**63), "maximum": 2**63 - 1}
TIME_RANGE = {"minimum": -(2**33), "maximum": 2**33}

_PY = {"int": "int", "number": "float", "time": "float", "str": "str", "bool": "bool", "any": "Any"}
_PY["row"] = "list[float]"


def annotation(f: Field) -> str:
    """The ``TypedDict`` annotation of a field, as written in ``documents.py``."""
    if f.kind == "object":
        assert f.table is not None
        text = f.table.name
    elif f.kind == "list":
        text = f"list[{f.table.name if f.table is not None else _PY[f.items or 'any']}]"
    elif f.kind == "map":
        text = f"dict[str, {_PY[f.items or 'any']}]"
    else:
        text = _PY[f.kind]
    if f.nullable:
        text = f"Optional[{text}]"
    return text if f.required else f"NotRequired[{text}]"


def families() -> dict[str, list[Table]]:
    """The tables by the ``kind`` of the first top-level document that nests them (``tables()``'s
    order): each kind's ``TypedDict`` s are generated into one module, ``documents_<kind>.py``."""
    reach = {kind: _reached(top) for kind, top in DOCUMENTS.items()}
    out: dict[str, list[Table]] = {kind: [] for kind in DOCUMENTS}
    for t in tables():
        out[next(kind for kind in DOCUMENTS if t.name in reach[kind])].append(t)
    return {kind: found for kind, found in out.items() if found}


def _reached(t: Table) -> set[str]:
    """The names of ``t`` and of every table nested in it."""
    return {t.name}.union(*(_reached(f.table) for f in t.fields if f.table is not None))


def module_of(kind: str) -> str:
    return f"documents_{kind}"


def _imports(module: str, names: Iterable[str]) -> list[str]:
    """``from module import names`` as ruff's isort writes it (one line if it fits in 120 columns)."""
    ordered = sorted(set(names), key=lambda n: (not n.isupper(), not n[:1].isupper(), n))  # constants, classes
    line = f"from {module} import {', '.join(ordered)}"
    if len(line) <= 120:
        return [line]
    return [f"from {module} import (", *(f"    {name}," for name in ordered), ")"]


def _family_header(kind: str, family: list[Table], home: dict[str, str]) -> list[str]:
    """The docstring and imports of ``kind``'s module: only the typing names its annotations use,
    and the tables of earlier families it nests."""
    text = " ".join(annotation(f) for t in family for f in t.fields)
    typing = ["TypedDict", *(n for n in ("Any", "Optional") if re.search(rf"\b{n}\b", text))]
    if "NotRequired[" in text:
        typing.append("TYPE_CHECKING")
    here = {t.name for t in family}
    nested = [f.table.name for t in family for f in t.fields if f.table is not None and f.table.name not in here]
    by_module: dict[str, list[str]] = {}
    for name in nested:
        by_module.setdefault(f"oomsight.wire.{home[name]}", []).append(name)
    out = [
        f'"""The ``TypedDict`` s of the ``{kind}`` document and of the objects first nested in it.',
        "GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``: edit the",
        'table, not this file. Import them from ``oomsight.wire.documents``."""',
        "",
        "from __future__ import annotations",
        "",
        *_imports("typing", typing),
    ]
    for module in sorted(by_module):
        out += ["", *_imports(module, by_module[module])]
    if "NotRequired[" in text:
        out += ["", "if TYPE_CHECKING:", "    from typing_extensions import NotRequired"]
    return [*out, "", "__all__ = [", *(f'    "{name}",' for name in sorted(here)), "]"]


def family_module(kind: str, family: list[Table], home: dict[str, str]) -> str:
    """The module of ``kind``'s ``TypedDict`` s; ``home`` maps every table to its module."""
    out = _family_header(kind, family, home)
    for t in family:
        out += ["", "", f"class {t.name}(TypedDict):", f'    """{t.doc}"""', ""]
        for f in t.fields:
            since = t.field_since(f)
            note = f"{f.doc} (since {since})" if since != t.since else f.doc
            out += textwrap.wrap(note, 112, initial_indent="    #: ", subsequent_indent="    #: ")
            out.append(f"    {f.name}: {annotation(f)}")
    return "\n".join(out) + "\n"


def python_module(kinds: Iterable[str]) -> str:
    """``documents.py``: every ``TypedDict`` of the ``documents_<kind>`` modules of ``kinds``."""
    by_module = {module_of(kind): [t.name for t in family] for kind, family in families().items() if kind in kinds}
    out = [
        '"""The spool documents as ``TypedDict`` s. GENERATED from ``oomsight.wire.fields`` by',
        "``python -m oomsight.wire.rendering``: edit the table, not this file.",
        "",
        "The ``TypedDict`` s of each top-level document, and of the objects first nested in it, are",
        "generated into ``documents_<kind>.py``; this module gathers them all. Optional keys are",
        "``NotRequired``: a reader sees the table's default in their place",
        "(``oomsight.wire.schema.validate(doc, fill_defaults=True)``).",
        '"""',
        "",
    ]
    for module in sorted(by_module):
        out += _imports(f"oomsight.wire.{module}", by_module[module])
    names = sorted(name for found in by_module.values() for name in found)
    return "\n".join([*out, "", "__all__ = [", *(f'    "{name}",' for name in names), "]"]) + "\n"


def python_modules() -> dict[str, str]:
    """Every generated Python module by path: ``documents.py`` and one module per document kind."""
    found = families()
    home = {t.name: module_of(kind) for kind, family in found.items() for t in family}
    modules = {os.path.join(WIRE, f"{module_of(kind)}.py"): family_module(kind, f, home) for kind, f in found.items()}
    return {DOCUMENTS_PY: python_module(found), **modules}


def _orphans(generated: Iterable[str]) -> list[str]:
    """Generated ``documents_*.py`` modules of document kinds the table no longer has."""
    paths = {os.path.join(WIRE, name) for name in os.listdir(WIRE) if _FAMILY_FILE.fullmatch(name)}
    return sorted(paths - set(generated))


def _json_type(f: Field, kind: Optional[str] = None, table: Optional[Table] = None) -> dict[str, Any]:
    kind = kind or f.kind
    if kind == "object":
        assert table is not None
        return {"$ref": f"#/$defs/{table.name}"}
    if kind == "list":
        item = _json_type(f, "object", f.table) if f.table is not None else _json_type(f, f.items or "any")
        return {"type": "array", "items": item}
    if kind == "map":
        return {"type": "object", "additionalProperties": _json_type(f, f.items or "any")}
    if kind == "row":
        return {"type": "array", "items": {"type": ["number", "boolean"]}}
    scalars: dict[str, dict[str, Any]] = {
        "int": {"type": "integer", **INT_RANGE},
        "number": {"type": "number"},
        "time": {"type": "number", **TIME_RANGE},
        "str": {"type": "string"},
        "bool": {"type": "boolean"},
        "any": {},
    }
    return scalars[kind]


def _json_field(f: Field, t: Table) -> dict[str, Any]:
    body = _json_type(f, table=f.table)
    if f.choices:
        body = {**body, "enum": list(f.choices)}
    if f.nullable:
        body = {"anyOf": [body, {"type": "null"}]}
    return {"description": f.doc, **body, "x-since": t.field_since(f)}


def json_schema() -> dict[str, Any]:
    defs = {
        t.name: {
            "type": "object",
            "description": t.doc,
            "properties": {f.name: _json_field(f, t) for f in t.fields},
            "required": [f.name for f in t.fields if f.required],
            "additionalProperties": True,
            "x-since": t.since,
        }
        for t in tables()
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://oomsight.io/spool-schema.json",
        "title": "oomsight spool document (schema_version 1)",
        "description": "GENERATED from exporter/oomsight/wire/fields.py by python -m oomsight.wire.rendering.",
        "oneOf": [{"$ref": f"#/$defs/{t.name}"} for t in DOCUMENTS.values()],
        "$defs": defs,
    }


def _md_type(f: Field) -> str:
    text = annotation(f).replace("NotRequired[", "", 1)[: None if f.required else -1]
    return f"`{text}`" + (" one of " + ", ".join(f"`{c}`" for c in f.choices) if f.choices else "")


def markdown_table(t: Table) -> str:
    rows = ["| key | type | required (else: the default) | since | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in t.fields:
        need = "yes" if f.required else f"no: `{json.dumps(default_of(f))}`"
        kind, meaning = _md_type(f).replace("|", "\\|"), f.doc.replace("|", "\\|")
        rows.append(f"| `{f.name}` | {kind} | {need} | {t.field_since(f)} | {meaning} |")
    return "\n".join(rows)


_SECTION = re.compile(r"(<!-- fields:(\w+) -->\n).*?(<!-- /fields -->)", re.S)


def markdown(text: str) -> str:
    """``text`` with every field section rewritten from the table."""
    by_name = {t.name: t for t in tables()}
    return _SECTION.sub(lambda m: f"{m.group(1)}{markdown_table(by_name[m.group(2)])}\n{m.group(3)}", text)


def outputs() -> dict[str, str]:
    with open(FORMAT_MD, encoding="utf-8") as fh:
        md = fh.read()
    return {
        **python_modules(),
        SCHEMA_JSON: json.dumps(json_schema(), indent=2) + "\n",
        FORMAT_MD: markdown(md),
    }


def drifted() -> list[str]:
    """The generated files whose content differs from what the table gives, and the generated
    modules of document kinds the table no longer has."""
    files = outputs()
    stale = []
    for path, text in files.items():
        try:
            with open(path, encoding="utf-8") as fh:
                current = fh.read()
        except OSError:
            current = None
        if current != text:
            stale.append(path)
    return stale + _orphans(files)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = drifted()
        for path in stale:
            print(f"{os.path.relpath(path, ROOT)} differs from the field table: run python -m oomsight.wire.rendering")
        return 1 if stale else 0
    files = outputs()
    for path, text in files.items():
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    for path in _orphans(files):
        os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
