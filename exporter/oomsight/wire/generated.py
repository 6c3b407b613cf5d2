"""Files generated from a table (the spool's field table, the settings table): each is written again
from it, or ``--check`` names those that differ, so CI fails when a generated file drifts."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Callable, Optional


def drifted(outputs: Mapping[str, str]) -> list[str]:
    """The paths of ``outputs`` (path -> the text the table gives) whose file differs, or is missing."""
    stale = []
    for path, text in outputs.items():
        try:
            with open(path, encoding="utf-8") as fh:
                current: Optional[str] = fh.read()
        except OSError:
            current = None
        if current != text:
            stale.append(path)
    return stale


def main(argv: Optional[list[str]], outputs: Callable[[], Mapping[str, str]], table: str, run: str, root: str) -> int:
    """``--check``: name each drifted file (relative to ``root``) and say how to write it again (1 if
    any); otherwise write every file (0)."""
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = drifted(outputs())
        for path in stale:
            print(f"{os.path.relpath(path, root)} differs from {table}: run {run}")
        return 1 if stale else 0
    for path, text in outputs().items():
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0
