"""Everything written from the settings tables (:mod:`oomsight.config.variables`): the dataclasses
of ``oomsight/config/hook.py`` and ``oomsight/config/sidecar.py``, and the tables in
``docs/configuration.md`` (each between ``<!-- settings:NAME -->`` and ``<!-- /settings -->``).

``python -m oomsight.config.rendering`` rewrites them; ``--check`` exits 1 when one has drifted.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from typing import Optional

from oomsight.config.table import Group, Setting, shown_default
from oomsight.config.variables import GROUPS, HOOK, INJECT, SIDECAR, SIDECAR_GROUPS, WEBHOOK, WEBHOOK_GROUPS
from oomsight.wire import generated

CONFIG = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(CONFIG, "..", "..", ".."))
HOOK_PY = os.path.join(CONFIG, "hook.py")
SIDECAR_PY = os.path.join(CONFIG, "sidecar.py")
WEBHOOK_PY = os.path.join(CONFIG, "webhook.py")
RUN = "python -m oomsight.config.rendering"
CONFIGURATION_MD = os.path.join(ROOT, "docs", "configuration.md")

_GENERATED = (
    "GENERATED from the tables of ``oomsight.config.variables`` by ``python -m oomsight.config.rendering``: "
    "edit the table, not this file. Each field's docstring names its variable"
)
_HOOK_DOC = (
    "Settings of the in-process hook: one frozen dataclass per component, a docstring per field.",
    " and ``oomsight.start()`` keyword. :class:`Settings` holds the groups; the runtime gives each component "
    "only its own.",
)
_SIDECAR_DOC = (
    "The fields of the sidecar's settings groups: one frozen dataclass each, a docstring per field.",
    " (and flag). ``oomsight_sidecar.settings`` extends each class with how it is read and checked.",
)
_WEBHOOK_DOC = (
    "The fields of the webhook's server settings: one frozen dataclass, a docstring per field.",
    " (and flag). ``oomsight_webhook.settings`` extends the class with how it is read and checked.",
)


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


def _field(row: Setting, keyword: bool) -> list[str]:
    names = f"`{row.variable}`; `start({row.keyword}=...)`" if keyword else f"`{row.variable}`"
    names += f"; `{row.flag}`" if row.flag else ""
    note = f"{row.meaning[:1].upper()}{row.meaning[1:]} ({names})."
    return ["", f"    {row.field}: {row.annotation()} = {_default(row)}", *_docstring(note)]


def _group_class(group: Group, rows: tuple[Setting, ...], keyword: bool) -> list[str]:
    out = ["", "", "@dataclasses.dataclass(frozen=True)", f"class {group.cls}:", *_docstring(group.doc)]
    for row in rows:
        out += _field(row, keyword)
    return out


def _head(doc: tuple[str, str], rows: tuple[Setting, ...], names: dict[str, set[str]]) -> list[str]:
    """The module's docstring and imports: ``names`` by module, and the default factories of ``rows``."""
    for row in rows:
        if callable(row.default):
            names.setdefault(row.default.__module__, set()).add(row.default.__name__)
    if any("Optional[" in row.annotation() for row in rows):
        names.setdefault("typing", set()).add("Optional")
    lines = {m: f"from {m} import {', '.join(sorted(n, key=_isort))}" for m, n in sorted(names.items())}
    stdlib = [line for m, line in lines.items() if not m.startswith("oomsight")]
    ours = [line for m, line in lines.items() if m.startswith("oomsight")]
    imports = "\n".join([*stdlib, *([""] if ours else []), *ours])
    text = textwrap.fill(_GENERATED + doc[1], 100)
    future = "from __future__ import annotations"
    return ['"""' + doc[0], "", text, '"""', "", future, "", "import dataclasses", *([imports] if imports else [])]


def python_module(groups: tuple[Group, ...] = GROUPS, rows: tuple[Setting, ...] = HOOK) -> str:
    """The source of ``oomsight/config/hook.py`` for ``groups`` and ``rows``."""
    names = {"collections.abc": {"Mapping"}, "typing": {"Optional"}, "oomsight.config": {"table"}}
    out = _head(_HOOK_DOC, rows, {**names, "oomsight.config.variables": {"HOOK", "check"}})
    for group in groups:
        out += _group_class(group, tuple(r for r in rows if r.group == group.name), keyword=True)
    root_doc = "Everything the hook can be told, one group per component; defaults keep its overhead far below 1 %."
    out += ["", "", "@dataclasses.dataclass(frozen=True)", "class Settings:", *_docstring(root_doc)]
    for row in (r for r in rows if not r.group):
        out += _field(row, keyword=True)
    for group in groups:
        field = f"    {group.name}: {group.cls} = dataclasses.field(default_factory={group.cls})"
        out += ["", field, *_docstring(group.doc)]
    return "\n".join(out) + "\n" + _ROOT_METHODS


def fields_module(groups: tuple[Group, ...], rows: tuple[Setting, ...], doc: tuple[str, str]) -> str:
    """The source of a module of fields (``oomsight/config/sidecar.py``): one class per group, no methods."""
    out = _head(doc, rows, {})
    for group in groups:
        out += _group_class(group, tuple(r for r in rows if r.group == group.name), keyword=False)
    return "\n".join(out) + "\n"


def markdown_table(rows: tuple[Setting, ...], keyword: bool = True) -> str:
    """The documentation's table of ``rows``: with the ``start()`` keyword column, else a flag
    column where a row has a flag."""
    flags = not keyword and any(row.flag for row in rows)
    second = "| `start()` keyword " if keyword else "| flag " if flags else ""
    out = [f"| variable {second}| default | meaning |", "| --- " * (4 if second else 3) + "|"]
    for row in rows:
        name = f"`{row.keyword}` | " if keyword else (f"`{row.flag}` | " if row.flag else "— | ") if flags else ""
        meaning = row.meaning.replace("|", "\\|")
        out.append(f"| `{row.variable}` | {name}{shown_default(row)} | {meaning} |")
    return "\n".join(out)


SECTIONS = {
    "hook": (HOOK, True),
    "sidecar": (tuple(r for r in SIDECAR if r.group not in ("pod", "limits")), False),
    "sidecar-limits": (tuple(r for r in SIDECAR if r.group == "limits"), False),
    "pod": (tuple(r for r in SIDECAR if r.group == "pod"), False),
    "webhook": (tuple(r for r in WEBHOOK if r.group != "limits"), False),
    "webhook-limits": (tuple(r for r in WEBHOOK if r.group == "limits"), False),
    "inject": (INJECT, False),
}
"""The documentation's settings sections: their rows, and whether they have ``start()`` keywords."""
_SECTION = re.compile(r"(<!-- settings:([\w-]+) -->\n).*?(<!-- /settings -->)", re.S)


def markdown(text: str, sections: dict[str, tuple[tuple[Setting, ...], bool]] = SECTIONS) -> str:
    """``text`` with every settings section rewritten; ValueError if one of ``sections`` is missing."""
    missing = sorted(set(sections) - {m.group(2) for m in _SECTION.finditer(text)})
    if missing:
        raise ValueError(f"no <!-- settings:{missing[0]} --> ... <!-- /settings --> section")
    return _SECTION.sub(lambda m: f"{m.group(1)}{markdown_table(*sections[m.group(2)])}\n{m.group(3)}", text)


def outputs() -> dict[str, str]:
    with open(CONFIGURATION_MD, encoding="utf-8") as fh:
        md = fh.read()
    return {
        HOOK_PY: python_module(),
        SIDECAR_PY: fields_module(SIDECAR_GROUPS, SIDECAR, _SIDECAR_DOC),
        WEBHOOK_PY: fields_module(WEBHOOK_GROUPS, WEBHOOK, _WEBHOOK_DOC),
        CONFIGURATION_MD: markdown(md),
    }


def drifted() -> list[str]:
    """The generated files whose content differs from what the table gives."""
    return generated.drifted(outputs())


def main(argv: Optional[list[str]] = None) -> int:
    return generated.main(argv, outputs, "the settings table", RUN, ROOT)


if __name__ == "__main__":
    sys.exit(main())
