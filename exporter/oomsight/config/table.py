"""The vocabulary of a settings table, and how a table is read.

A setting is named once, by one :class:`Setting` row: its ``oomsight.start()`` keyword, the
field that holds its value, how its environment variable is parsed and what it means. The
variable's name derives from the keyword (``OOMSIGHT_`` + the keyword in capitals), the
settings dataclasses and the table of ``docs/configuration.md`` are generated from the rows
(:mod:`oomsight.config.rendering`), and :func:`from_env` and :func:`replace` read any table.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Mapping
from typing import Callable, Optional, TypeVar, Union

from oomsight.config.values import ConfigError

PREFIX = "OOMSIGHT_"
Value = Union[bool, int, float, str, None]
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Group:
    """A group of settings: one frozen dataclass, given by its component to the part it concerns."""

    name: str
    """The root's field that holds the group (``Settings.sampling``)."""

    cls: str
    """The dataclass's name (``SamplingSettings``)."""

    doc: str
    """What the group is for; the class's docstring and the root field's."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: every name it has and its line in ``docs/configuration.md``."""

    keyword: str
    """The keyword of ``oomsight.start()`` and ``Settings.replace()``."""

    group: str
    """The :class:`Group` that holds the field; empty for the root's own fields."""

    field: str
    """The field inside that group."""

    default: Union[Value, Callable[[], Value]]
    """The default value, or a function that makes it when the settings are made."""

    parse: Callable[[str, str], Value]
    """``parse(name, raw)``: the value of the text ``raw``, or :class:`ConfigError` naming ``name``."""

    meaning: str
    """What it does: the line in ``docs/configuration.md`` and the field's docstring."""

    env: str = ""
    """The variable's name where it is not ``OOMSIGHT_<KEYWORD>`` (a name users set before the rule)."""

    verbatim: bool = False
    """Paths are taken as written; other values are stripped of surrounding blanks first."""

    shown: str = ""
    """The default as the documentation shows it, where the value alone would not say it."""

    flag: str = ""
    """The command-line flag that overrides the variable (the sidecar's and webhook's commands)."""

    kind: str = ""
    """The field's type where the default's type does not say it (``Optional[int]``)."""

    empty: bool = False
    """A variable set to blanks means the empty value (a resource limit left unset), not the default."""

    @property
    def variable(self) -> str:
        """The environment variable."""
        return self.env or PREFIX + self.keyword.upper()

    def default_value(self) -> Value:
        return self.default() if callable(self.default) else self.default

    def annotation(self) -> str:
        """The field's type, as written in the generated dataclass."""
        return self.kind or type(self.default_value()).__name__

    def read(self, raw: str) -> Value:
        """The value of the variable's text ``raw`` (stripped first unless ``verbatim``)."""
        return self.parse(self.variable, raw if self.verbatim else raw.strip())


def variables(rows: tuple[Setting, ...]) -> dict[str, str]:
    """Each row's variable by keyword: the names other components write (the webhook's pod patches)
    as the table gives them, not written again."""
    return {row.keyword: row.variable for row in rows}


def defaults(rows: tuple[Setting, ...], group: str) -> dict[str, Value]:
    """The default of every field of ``group``, by field."""
    return {row.field: row.default_value() for row in rows if row.group == group}


def flag_help(rows: tuple[Setting, ...], flag: str, text: str) -> str:
    """``--flag``'s help: ``text``, the variable it overrides and its default as the docs show it
    (generated, so the flag's default and the documentation's are one)."""
    row = next(r for r in rows if r.flag == flag)
    shown = shown_default(row).replace("`", "").replace("%", "%%")
    return f"{text} (${row.variable}; default {shown})"


def shown_default(row: Setting) -> str:
    """The default as the documentation shows it."""
    if row.shown:
        return row.shown
    value: Value = row.default_value()
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`" if value != "" else "empty"


def with_flags(cls: type[R], values: dict[str, object], flags: Mapping[str, object]) -> R:
    """Settings from env ``values`` overridden by the CLI ``flags`` that were given, validated
    (the sidecar's and the webhook's settings classes have a ``validate()``)."""
    values.update({k: v for k, v in flags.items() if v is not None})
    settings = cls(**values)
    settings.validate()  # type: ignore[attr-defined]
    return settings


def read_env(rows: tuple[Setting, ...], env: Mapping[str, str]) -> dict[str, dict[str, Value]]:
    """The values of the variables set in ``env``, by group (``""``: the root) and field."""
    out: dict[str, dict[str, Value]] = {}
    for row in rows:
        raw = env.get(row.variable)
        if raw is not None:
            out.setdefault(row.group, {})[row.field] = row.read(raw)
    return out


def read_group(rows: tuple[Setting, ...], group: str, env: Mapping[str, str]) -> dict[str, Value]:
    """The fields of ``group`` that ``env`` sets, by field. A variable set to blanks keeps its
    default (the sidecar's and the webhook's rule; the hook reads a blank as written)."""
    found = ((row, env.get(row.variable)) for row in rows if row.group == group)
    return {row.field: row.read(raw) for row, raw in found if raw is not None and (raw.strip() or row.empty)}


def read_keywords(rows: tuple[Setting, ...], changes: Mapping[str, object]) -> dict[str, dict[str, Value]]:
    """``changes`` by keyword, each parsed as its variable would be (``window_seconds=-1`` is
    refused as ``OOMSIGHT_WINDOW_SECONDS=-1`` is), by group and field."""
    by_keyword = {row.keyword: row for row in rows}
    unknown = sorted(set(changes) - set(by_keyword))
    if unknown:
        raise ConfigError(f"unknown oomsight setting(s): {', '.join(unknown)}")
    out: dict[str, dict[str, Value]] = {}
    for keyword, value in changes.items():
        row = by_keyword[keyword]
        if value is None or (isinstance(value, bool) and not isinstance(row.default_value(), bool)):
            raise ConfigError(f"{keyword}={value!r} is not a {row.annotation()}")
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        out.setdefault(row.group, {})[row.field] = row.parse(keyword, text)
    return out


def apply(root: R, values: Mapping[str, Mapping[str, Value]]) -> R:
    """A copy of ``root`` with ``values`` (by group and field, as read) set."""
    top: dict[str, object] = dict(values.get("", {}))
    for group, fields in values.items():
        if group:
            top[group] = dataclasses.replace(getattr(root, group), **fields)
    return dataclasses.replace(root, **top)  # type: ignore[type-var]


def from_env(cls: type[R], rows: tuple[Setting, ...], environ: Optional[Mapping[str, str]]) -> R:
    """``cls()`` with every variable of ``rows`` that ``environ`` (default ``os.environ``) sets."""
    return apply(cls(), read_env(rows, os.environ if environ is None else environ))


def signature(rows: tuple[Setting, ...]) -> inspect.Signature:
    """The keyword-only signature of a function taking the keywords of ``rows`` (``oomsight.start``)."""
    kind = inspect.Parameter.KEYWORD_ONLY
    values = [(r.keyword, r.default_value()) for r in rows]
    params = [inspect.Parameter(name, kind, default=value, annotation=type(value)) for name, value in values]
    return inspect.Signature(params, return_annotation=bool)
