"""The words of a diagnosis live apart from its deciding (issue 48, ``analysis.wording``): every template is used
and fills, every key a rule says exists, and no rule holds a sentence of its own."""

from __future__ import annotations

import ast
import os
import re

import pytest

from oomsight.analysis import wording

ANALYSIS = os.path.join(os.path.dirname(__file__), "..", "exporter", "oomsight", "analysis")
DECIDING = ("diagnosis.py", "findings.py", "evidence.py")


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(open(os.path.join(ANALYSIS, name)).read()) for name in DECIDING}


def _said_keys() -> set[str]:
    """Every string constant that reaches ``say(...)`` as its key, both arms of a conditional too."""
    keys: set[str] = set()
    for tree in _trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "say" and node.args:
                for sub in ast.walk(node.args[0]):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        keys.add(sub.value)
    return keys


def test_every_template_is_said_and_every_said_key_exists() -> None:
    said = _said_keys()
    assert said - set(wording.SENTENCES) == set()
    assert set(wording.SENTENCES) - said == set()


@pytest.mark.parametrize("key", sorted(wording.SENTENCES))
def test_every_template_fills(key: str) -> None:
    values = {name: 1536 * 1024 * 1024 for name in wording.placeholders(key)}
    text = wording.say(key, **values)
    assert "{" not in text and "}" not in text
    if "{" in wording.SENTENCES[key] and ":bytes}" in wording.SENTENCES[key]:
        assert "1.50 GiB" in text


def test_bytes_render_as_the_reports_do_and_missing_as_unknown() -> None:
    assert wording.say("oversized", requested=3 << 30, usable=5 << 29) == (
        "One request of 3.00 GiB is more than half of the 2.50 GiB this process could use (reserved plus free)."
    )
    assert "largest free block unknown" in wording.say(
        "fragmentation", requested=1, cached_free=2, block=None, free=3
    )
    with pytest.raises(KeyError):
        wording.say("oversized", requested=1)


def _docstrings(tree: ast.Module) -> set[int]:
    """A docstring, or the string documenting the assignment before it: a bare string statement."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                ids.add(id(stmt.value))
    return ids


def test_no_rule_holds_a_sentence_of_its_own() -> None:
    """Outside docstrings and the precedence table (its rows' reasons and the markdown docs/diagnosis.md prints), the
    deciding modules hold no prose: a string of four words or more is a sentence a user reads, and lives in
    ``analysis.wording``."""
    sentence = re.compile(r"(\S+\s+){3,}\S+")
    found = []
    for name, tree in _trees().items():
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            table = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Row"
            if table or (isinstance(node, ast.FunctionDef) and node.name == "precedence_markdown"):
                skip.update(id(sub) for sub in ast.walk(node))
        for node in ast.walk(tree):
            prose = isinstance(node, ast.Constant) and isinstance(node.value, str) and sentence.search(node.value)
            if prose and id(node) not in skip:
                found.append(f"{name}:{node.lineno}: {node.value[:60]}")
    assert found == []
