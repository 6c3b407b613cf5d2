"""A part's samples as plain rows, and their values as prometheus_client writes them
(``oomsight.metrics.exposition`` writes the lines)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable

from prometheus_client.utils import floatToGoString as _float_to_go

go: Callable[[Any], str] = _float_to_go
"""A sample value as prometheus_client's encoders write it."""
_GO_KEPT = 65536
"""Values whose text :func:`line_end_of` keeps (a thousand ranks' samples, most unchanged between scrapes)."""


class _LineEnds(dict[Any, str]):
    """``floatToGoString`` of the values seen lately, then a newline. The text is a function of
    ``float(value)``, and equal numbers have equal floats, so equal values share a text; but for
    zero: ``-0.0`` equals ``0`` and writes otherwise, so zeros are never kept (NaN equals nothing:
    never found)."""

    def __missing__(self, value: Any) -> str:
        text = go(value) + "\n"
        if value != 0:
            if len(self) >= _GO_KEPT:
                self.clear()
            self[value] = text
        return text


line_end_of = _LineEnds().__getitem__
"""What ends a sample's line: its value as prometheus_client's encoders write it, and a newline;
a dictionary lookup for a value seen lately."""

Items = tuple[tuple[str, str], ...]
"""Label names and values of a sample, in the family's label order."""
Row = tuple[str, str, Items, Any]
"""A sample: (family name, sample name, label items, value)."""


class Rows:
    """Samples of a part as plain rows: what prometheus_client's ``add_metric`` would make
    (a gauge's sample is named as its family, a counter's ``_total``, an info's ``_info`` with
    value 1), without making a family or a sample object per value. Kept as three lists in the
    order the samples came (family, label items, value), and each family's one sample name (a
    family of several is given as a family); iterating gives rows (family, sample name, label
    items, value)."""

    __slots__ = ("families", "items", "names", "values")

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.families: list[str] = []
        self.items: list[Items] = []
        self.values: list[Any] = []
        self.names: dict[str, str] = {}
        for row in rows:
            self.append(row)

    def append(self, row: Row) -> None:
        family, name, items, value = row
        known = self.names.setdefault(family, name)
        if known != name:
            raise ValueError(f"{family}: samples {known} and {name}; give such a family as a family")
        self.families.append(family)
        self.items.append(items)
        self.values.append(value)

    def name_of(self, family: str) -> str:
        """The sample name of ``family``'s samples."""
        return self.names[family]

    def __iter__(self) -> Iterator[Row]:
        for family, items, value in zip(self.families, self.items, self.values):
            yield family, self.name_of(family), items, value

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)
