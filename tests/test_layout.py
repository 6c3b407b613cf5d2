"""The house style's layout (STYLE.md, "Size follows meaning"): a module holds one concern, whatever
its length, as the anchors split by concern (client_python's ``exposition.py`` is 828 lines, kopf's
largest module 666). No line count decides a module's size; what can be checked is that each module
says what its concern is (a docstring; ``__main__`` entry points excepted), that none is a grab bag
by name (``utils``, ``helpers``, ``common``), and that no function anywhere in the library, the
platform the sidecar and the webhook stand on (``server/``), the sidecar, the webhook, the dashboards
or the benchmarks is over 60 lines (generated modules included).
The layers themselves are import-linter's contracts (``.importlinter``: the folder is the layer).

    python tests/test_layout.py    # lists every module and function that breaks these rules
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE_ROOTS = ("exporter/oomsight", "server", "sidecar", "webhook", "dashboards")
FUNCTION_ROOTS = (*MODULE_ROOTS, "benchmarks")
MAX_FUNCTION_LINES = 60
GRAB_BAGS = frozenset({"utils", "util", "helpers", "helper", "common", "misc"})


def sources(roots: tuple[str, ...]) -> Iterator[Path]:
    for root in roots:
        yield from sorted(p for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def modules_without_a_concern() -> list[str]:
    """Modules that do not say what they hold (no docstring), or whose name says they hold anything."""
    found = []
    for path in sources(MODULE_ROOTS):
        if path.stem == "__main__":
            continue
        if path.stem in GRAB_BAGS or not ast.get_docstring(_tree(path)):
            found.append(str(path.relative_to(ROOT)))
    return found


def long_functions() -> list[tuple[str, int, str, int]]:
    """Every function (methods and nested ones too) over ``MAX_FUNCTION_LINES``, from its ``def``
    line to its last: (path, line, name, lines)."""
    found = []
    for path in sources(FUNCTION_ROOTS):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((str(path.relative_to(ROOT)), node.lineno, node.name, lines))
    return found


def test_every_module_says_what_it_holds_and_none_is_a_grab_bag() -> None:
    assert modules_without_a_concern() == []


def test_no_function_is_over_60_lines() -> None:
    assert long_functions() == []


def test_the_checks_walk_every_package_folder() -> None:
    """A package folder (one with ``py.typed``) the checks do not walk escapes the house's rules."""
    packages = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/*/py.typed")}
    walked = {root.split("/")[0] for root in MODULE_ROOTS}
    assert packages <= walked, f"not walked by the layout checks: {sorted(packages - walked)}"


def test_the_checks_see_a_long_function_a_module_without_a_docstring_and_a_grab_bag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_module = '"""One concern, at any length."""\n' + "\n" * 1000
    (tmp_path / "big.py").write_text(long_module + "def long():\n" + body + "\n")
    (tmp_path / "silent.py").write_text("X = 1\n")
    (tmp_path / "helpers.py").write_text('"""Anything."""\n')
    (tmp_path / "__main__.py").write_text("import big\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULE_ROOTS", (".",))
    monkeypatch.setattr(sys.modules[__name__], "FUNCTION_ROOTS", (".",))
    assert long_functions() == [("big.py", 1002, "long", MAX_FUNCTION_LINES + 1)]
    assert modules_without_a_concern() == ["helpers.py", "silent.py"]


if __name__ == "__main__":
    for path in modules_without_a_concern():
        print(f"{path}: no docstring saying what it holds, or a grab-bag name")
    for path, line, name, n in long_functions():
        print(f"{path}:{line}: {name}() {n} lines")
    sys.exit(1 if modules_without_a_concern() or long_functions() else 0)
