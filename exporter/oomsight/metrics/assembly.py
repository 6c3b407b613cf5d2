"""The lines of a scrape's parts put in family order, a column at a time.

Each part gives its lines and the family of each (``oomsight.metrics.lines``); the text lists,
family by family, the lines every part gave that family, in part order. Parts whose families
come in the same sequence (every process's state, every process's own series: the same object,
``Format`` keeps one per sequence) are a :class:`Group`: their lines are transposed at once, and
each family takes its column (or, for a family a part gives several lines, its columns
interleaved part by part). So a thousand processes cost a few C passes per family of their
sequence, not a step per line. A family that several groups give is merged by part index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any


class Group:
    """Parts whose lines have the same family sequence: where each part stands in the scrape, and its lines."""

    __slots__ = ("families", "indices", "lines")

    def __init__(self, families: Sequence[str]) -> None:
        self.families = families
        self.indices: list[int] = []
        self.lines: list[Sequence[str]] = []

    def columns(self) -> dict[str, tuple[Any, bool]]:
        """Family -> its lines in part order (one per part), or, where a part gives the family
        several lines, each part's lines as a tuple (``True``)."""
        if not self.families:
            return {}
        rows = list(zip(*self.lines))  # rows[j]: the j-th line of every part
        at: dict[str, list[int]] = {}
        for j, name in enumerate(self.families):
            at.setdefault(name, []).append(j)
        return {
            name: (rows[js[0]], False) if len(js) == 1 else (list(zip(*[rows[j] for j in js])), True)
            for name, js in at.items()
        }


def grouped(parts: Iterable[tuple[Sequence[str], Sequence[str]]]) -> list[Group]:
    """The parts' (families, lines), in scrape order, grouped by their families object."""
    groups: dict[int, Group] = {}
    for index, (families, lines) in enumerate(parts):
        group = groups.get(id(families))
        if group is None:
            group = groups[id(families)] = Group(families)
        group.indices.append(index)
        group.lines.append(lines)
    return list(groups.values())


def assemble(headers: dict[str, str], groups: list[Group]) -> str:
    """Every family of ``headers`` (name -> header text, in exposition order): its header and
    then the lines each group gave it, in part order."""
    given: dict[str, list[tuple[Group, Any, bool]]] = {}
    for group in groups:
        for name, (column, several) in group.columns().items():
            given.setdefault(name, []).append((group, column, several))
    unknown = given.keys() - headers.keys()
    if unknown:
        raise KeyError(f"families outside the layout: {sorted(unknown)}")
    out: list[Iterable[str]] = []
    for name, header in headers.items():
        out.append((header,))
        found = given.get(name)
        if not found:
            continue
        if len(found) == 1:
            _, column, several = found[0]
            out.append(chain.from_iterable(column) if several else column)
            continue
        # several groups give this family: each part's lines, by where the part stands
        merged = sorted(
            chain.from_iterable(
                zip(group.indices, column if several else zip(column)) for group, column, several in found
            )
        )
        out.append(chain.from_iterable(lines for _, lines in merged))
    return "".join(chain.from_iterable(out))
