"""No stale name (issue 35): every module path that the docs, the README, the tool configuration
and the packages' docstrings name exists. A rename or a deletion that leaves a pointer behind fails
here, not in a newcomer's first hour."""

from __future__ import annotations

import os
import re

import pytest

from fakes import ROOT

PACKAGES = {
    "oomsight": "exporter/oomsight",
    "oomsight_server": "server/oomsight_server",
    "oomsight_sidecar": "sidecar/oomsight_sidecar",
    "oomsight_webhook": "webhook/oomsight_webhook",
}
NOT_MODULES = {"oomsight.io", "oomsight.commands", "oomsight.rules", "oomsight.dropped_forward_hook"}
"""Dotted names that are not modules: the annotation domain, the entry-point group, the rule
files' names, a logger's name."""
_DOTTED = re.compile(r"\b(oomsight(?:_server|_sidecar|_webhook)?)((?:\.[a-z_][a-z0-9_]*)+)")
_LAYER_PATH = re.compile(r"`((?:wire|hook|analysis|metrics|predict|tools|config)/[a-z_/]+\.py)`")
_TREE_PATH = re.compile(r"\b((?:exporter|server|sidecar|webhook|tests|benchmarks|dashboards|scripts)/[\w/.-]+\.py)\b")


def _texts():
    names = [os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(ROOT, "docs"))) if n.endswith(".md")]
    names += ["README.md", "pyproject.toml", ".importlinter"]
    for top in PACKAGES.values():
        for folder, _dirs, files in os.walk(os.path.join(ROOT, top)):
            names += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py")]
    for name in names:
        with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
            yield name, fh.read()


def _module_exists(package: str, parts: list[str]) -> bool:
    """``package.parts``: modules and folders as far as they go, then at most a name that the last
    package's ``__init__`` or the module itself defines (a class, a function, a constant)."""
    base = os.path.join(ROOT, PACKAGES[package])
    for part in parts:
        if os.path.isdir(os.path.join(base, part)):
            base = os.path.join(base, part)
            continue
        if os.path.isfile(os.path.join(base, part + ".py")):
            return True
        init = os.path.join(base, "__init__.py")
        with open(init, encoding="utf-8") as fh:
            defined = rf"^(?:def|class) {part}\b|^{part}\s*[:=]|^from \S+ import .*\b{part}\b|^    {part},$"
            return re.search(defined, fh.read(), re.M) is not None
    return True


def stale_names() -> list[tuple[str, str]]:
    found = []
    for name, text in _texts():
        for m in _DOTTED.finditer(text):
            dotted = m.group(0)
            if any(dotted == n or dotted.startswith(n + ".") for n in NOT_MODULES):
                continue
            if not _module_exists(m.group(1), m.group(2).strip(".").split(".")):
                found.append((name, dotted))
        for m in _LAYER_PATH.finditer(text):
            if not os.path.exists(os.path.join(ROOT, "exporter", "oomsight", m.group(1))):
                found.append((name, m.group(1)))
        for m in _TREE_PATH.finditer(text):
            if not os.path.exists(os.path.join(ROOT, m.group(1))):
                found.append((name, m.group(1)))
    return sorted(set(found))


def test_every_module_path_named_in_docs_docstrings_and_tool_configuration_exists():
    assert stale_names() == []


@pytest.mark.parametrize(
    "text",
    ["see `metrics/exposition.py`", "oomsight_sidecar.listener.ServerLimits", "in sidecar/oomsight_sidecar/kube.py"],
)
def test_a_deleted_or_moved_module_is_found(text, monkeypatch):
    monkeypatch.setattr(__import__(__name__), "_texts", lambda: iter([("doc.md", text)]))
    assert stale_names() != []
