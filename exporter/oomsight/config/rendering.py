"""Everything written from the hook's settings table (:mod:`oomsight.config.variables`): the
dataclasses of ``oomsight/config/hook.py`` and the table in ``docs/configuration.md`` (between
``<!-- settings:hook -->`` and ``<!-- /settings -->``).

``python -m oomsight.config.rendering`` rewrites them; ``--check`` exits 1 when one has drifted.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from typing import Optional

from oomsight.config.table import Group, Setting, Value
from oomsight.config.variables import GROUPS, HOOK

CONFIG = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(CONFIG, "..", "..", ".."))
HOOK_PY = os.path.join(CONFIG, "hook.py")
RUN = "python -m oomsight.config.rendering"
CONFIGURATION_MD = os.path.join(ROOT, "docs", "configuration.md")

_HEADER = '''"""Settings of the in-process hook: one frozen dataclass per component, a docstring per field.

GENERATED from the table of ``oomsight.config.variables`` by ``python -m oomsight.config.rendering``:
edit the table, not this file. Each field's docstring names its variable and ``oomsight.start()``
keyword. :class:`Settings` holds the groups; the runtime gives each component only its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

from oomsight.config import table
{imports}
'''

_ROOT_METHODS = '''
    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Settings:
        """Every variable of the table that ``environ`` (default ``os.environ``) sets; a bad value
        or combination raises :class:`~oomsight.config.values.ConfigError` naming the variable."""
        settings = table.from_env(cls, HOOK, environ)
        check(settings)
        return settings

    def replace(self, **keywords: object) -> Settings:
        """A copy with ``oomsight.start()``'s ``keywords`` set, each parsed and checked as its variable."""
        settings = table.apply(self, table.read_keywords(HOOK, keywords))
        check(settings)
        return settings
'''


def _docstring(text: str, indent: str = "    ") -> list[str]:
    lines = textwrap.wrap(text.replace("`", "``"), 114 - len(indent))
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return [indent + line for line in lines]


def _isort(name: str) -> tuple[bool, str]:
    """Constants first, as ruff's isort orders the names of one import."""
    return (not name.isupper(), name)


def _default(row: Setting) -> str:
    if callable(row.default):
        return f"dataclasses.field(default_factory={row.default.__name__})"
    value = row.default
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:_}" if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000 else repr(value)


def _field(row: Setting) -> list[str]:
    note = f"{row.meaning[:1].upper()}{row.meaning[1:]} (`{row.variable}`; `start({row.keyword}=...)`)."
    return ["", f"    {row.field}: {row.annotation()} = {_default(row)}", *_docstring(note)]


def _group_class(group: Group, rows: tuple[Setting, ...]) -> list[str]:
    out = ["", "", "@dataclasses.dataclass(frozen=True)", f"class {group.cls}:", *_docstring(group.doc)]
    for row in rows:
        out += _field(row)
    return out


def python_module(groups: tuple[Group, ...] = GROUPS, rows: tuple[Setting, ...] = HOOK) -> str:
    """The source of ``oomsight/config/hook.py`` for ``groups`` and ``rows``."""
    names: dict[str, set[str]] = {"oomsight.config.variables": {"HOOK", "check"}}
    for row in rows:
        if callable(row.default):
            names.setdefault(row.default.__module__, set()).add(row.default.__name__)
    imports = "\n".join(f"from {m} import {', '.join(sorted(n, key=_isort))}" for m, n in sorted(names.items()))
    out = [_HEADER.format(imports=imports).rstrip("\n")]
    for group in groups:
        out += _group_class(group, tuple(r for r in rows if r.group == group.name))
    root_doc = "Everything the hook can be told, one group per component; defaults keep its overhead far below 1 %."
    out += ["", "", "@dataclasses.dataclass(frozen=True)", "class Settings:", *_docstring(root_doc)]
    for row in (r for r in rows if not r.group):
        out += _field(row)
    for group in groups:
        field = f"    {group.name}: {group.cls} = dataclasses.field(default_factory={group.cls})"
        out += ["", field, *_docstring(group.doc)]
    return "\n".join(out) + "\n" + _ROOT_METHODS


def shown_default(row: Setting) -> str:
    """The default as the documentation's table shows it."""
    if row.shown:
        return row.shown
    value: Value = row.default_value()
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`" if value != "" else "empty"


def markdown_table(rows: tuple[Setting, ...] = HOOK) -> str:
    out = ["| variable | `start()` keyword | default | meaning |", "| --- | --- | --- | --- |"]
    for row in rows:
        meaning = row.meaning.replace("|", "\\|")
        out.append(f"| `{row.variable}` | `{row.keyword}` | {shown_default(row)} | {meaning} |")
    return "\n".join(out)


_SECTION = re.compile(r"(<!-- settings:hook -->\n).*?(<!-- /settings -->)", re.S)


def markdown(text: str, rows: tuple[Setting, ...] = HOOK) -> str:
    """``text`` with its settings section rewritten from ``rows``; ValueError if it has none."""
    if not _SECTION.search(text):
        raise ValueError("no <!-- settings:hook --> ... <!-- /settings --> section")
    return _SECTION.sub(lambda m: f"{m.group(1)}{markdown_table(rows)}\n{m.group(2)}", text)


def outputs() -> dict[str, str]:
    with open(CONFIGURATION_MD, encoding="utf-8") as fh:
        md = fh.read()
    return {HOOK_PY: python_module(), CONFIGURATION_MD: markdown(md)}


def drifted() -> list[str]:
    """The generated files whose content differs from what the table gives."""
    stale = []
    for path, text in outputs().items():
        try:
            with open(path, encoding="utf-8") as fh:
                current: Optional[str] = fh.read()
        except OSError:
            current = None
        if current != text:
            stale.append(path)
    return stale


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = drifted()
        for path in stale:
            print(f"{os.path.relpath(path, ROOT)} differs from the settings table: run {RUN}")
        return 1 if stale else 0
    for path, text in outputs().items():
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
