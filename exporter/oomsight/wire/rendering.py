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

from oomsight.wire import generated
from oomsight.wire.fields import DOCUMENTS, tables
from oomsight.wire.fieldtypes import LABEL_MAX_CHARS, Field, Table, default_of

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WIRE = os.path.dirname(os.path.abspath(__file__))
DOCUMENTS_PY = os.path.join(WIRE, "documents.py")
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


def _imports(module: str, names: Iterable[str]) -> list[str]:
    """``from module import names`` as ruff's isort writes it (one line if it fits in 120 columns)."""
    ordered = sorted(set(names), key=lambda n: (not n.isupper(), not n[:1].isupper(), n))  # constants, classes
    line = f"from {module} import {', '.join(ordered)}"
    if len(line) <= 120:
        return [line]
    return [f"from {module} import (", *(f"    {name}," for name in ordered), ")"]


def _header(found: list[Table]) -> list[str]:
    """The docstring and imports of ``documents.py``: only the typing names its annotations use."""
    text = " ".join(annotation(f) for t in found for f in t.fields)
    typing = ["TypedDict", *(n for n in ("Any", "Optional") if re.search(rf"\b{n}\b", text))]
    if "NotRequired[" in text:
        typing.append("TYPE_CHECKING")
    out = [
        '"""The spool documents as ``TypedDict`` s, each top-level document after the objects it is the first',
        "to nest. GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``:",
        "edit the table, not this file. Optional keys are ``NotRequired``: a reader sees the table's",
        "default in their place (``oomsight.wire.schema.validate(doc, fill_defaults=True)``).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        *_imports("typing", typing),
    ]
    if "NotRequired[" in text:
        out += ["", "if TYPE_CHECKING:", "    from typing_extensions import NotRequired"]
    return [*out, "", "__all__ = [", *(f'    "{name}",' for name in sorted(t.name for t in found)), "]"]


def python_module() -> str:
    """``documents.py``: the ``TypedDict`` of every table, in the table's order (``tables()``)."""
    found = tables()
    out = _header(found)
    for t in found:
        out += ["", "", f"class {t.name}(TypedDict):", f'    """{t.doc}"""', ""]
        for f in t.fields:
            since = t.field_since(f)
            note = f"{f.doc} (since {since})" if since != t.since else f.doc
            out += textwrap.wrap(note, 112, initial_indent="    #: ", subsequent_indent="    #: ")
            out.append(f"    {f.name}: {annotation(f)}")
    return "\n".join(out) + "\n"


def _json_type(f: Field, kind: Optional[str] = None, table: Optional[Table] = None) -> dict[str, Any]:
    kind = kind or f.kind
    if kind == "object":
        assert table is not None
        return {"$ref": f"#/$defs/{table.name}"}
    if kind == "list":
        item = _json_type(f, "object", f.table) if f.table is not None else _json_type(f, f.items or "any")
        return {"type": "array", "items": item}
    if kind == "map":
        found = {"type": "object", "additionalProperties": _json_type(f, f.items or "any")}
        return {**found, "propertyNames": {"maxLength": LABEL_MAX_CHARS}} if f.label else found
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
    if f.counter and kind in ("int", "number"):
        return {**scalars[kind], "minimum": 0}
    return {**scalars[kind], "maxLength": LABEL_MAX_CHARS} if f.label and kind == "str" else scalars[kind]


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
    bounds = [" >= 0 (a counter)"] if f.counter else []
    if f.label:
        bounds.append(f" {'keys ' if f.kind == 'map' else ''}at most {LABEL_MAX_CHARS} characters (a label)")
    return f"`{text}`" + (" one of " + ", ".join(f"`{c}`" for c in f.choices) if f.choices else "") + ",".join(bounds)


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
        DOCUMENTS_PY: python_module(),
        SCHEMA_JSON: json.dumps(json_schema(), indent=2) + "\n",
        FORMAT_MD: markdown(md),
    }


def drifted() -> list[str]:
    """The generated files whose content differs from what the table gives."""
    return generated.drifted(outputs())


def main(argv: Optional[list[str]] = None) -> int:
    return generated.main(argv, outputs, "the field table", "python -m oomsight.wire.rendering", ROOT)


if __name__ == "__main__":
    sys.exit(main())
