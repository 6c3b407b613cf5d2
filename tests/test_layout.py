"""The house style's sizes (issue 11): no module of the library,
the sidecar, the webhook or the dashboards over 400 lines, and no function anywhere in them or
in the benchmarks over 60 lines (generated modules included).

    python tests/test_layout.py    # lists every module and function over the limits
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE_ROOTS = ("exporter/oomsight", "sidecar", "webhook", "dashboards")
FUNCTION_ROOTS = (*MODULE_ROOTS, "benchmarks")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def sources(roots: tuple[str, ...]) -> Iterator[Path]:
    for root in roots:
        yield from sorted(p for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts)


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_modules() -> dict[str, int]:
    """Every module over ``MAX_MODULE_LINES``, by its path from the repository root."""
    lengths = {str(p.relative_to(ROOT)): module_lines(p) for p in sources(MODULE_ROOTS)}
    return {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES}


def long_functions() -> list[tuple[str, int, str, int]]:
    """Every function (methods and nested ones too) over ``MAX_FUNCTION_LINES``, from its ``def``
    line to its last: (path, line, name, lines)."""
    found = []
    for path in sources(FUNCTION_ROOTS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((str(path.relative_to(ROOT)), node.lineno, node.name, lines))
    return found


def test_no_module_is_over_400_lines() -> None:
    assert long_modules() == {}, "split these modules"


def test_no_function_is_over_60_lines() -> None:
    assert long_functions() == []


def test_the_generated_wire_documents_are_held_to_the_limits_too() -> None:
    wire = ROOT / "exporter" / "oomsight" / "wire"
    generated = [wire / "documents.py", *sorted(wire.glob("documents_*.py"))]
    assert len(generated) > 1
    assert all(module_lines(p) <= MAX_MODULE_LINES for p in generated)


def test_the_check_sees_a_long_function_and_a_long_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "big.py").write_text("def long():\n" + body + "\n" + "\n" * MAX_MODULE_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "MODULE_ROOTS", (".",))
    monkeypatch.setattr(sys.modules[__name__], "FUNCTION_ROOTS", (".",))
    assert long_functions() == [("big.py", 1, "long", MAX_FUNCTION_LINES + 1)]
    assert long_modules() == {"big.py": MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES}


if __name__ == "__main__":
    for path, n in long_modules().items():
        print(f"{path}: {n} lines (module)")
    for path, line, name, n in long_functions():
        print(f"{path}:{line}: {name}() {n} lines")
    sys.exit(1 if long_modules() or long_functions() else 0)
