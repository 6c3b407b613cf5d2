"""A part's samples as plain rows, and their values as prometheus_client writes them
(``oomsight.metrics.exposition`` writes the lines)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable

from prometheus_client.utils import floatToGoString as _float_to_go

go: Callable[[Any], str] = _float_to_go
"""A sample value as prometheus_client's encoders write it."""
_GO_KEPT = 65536
"""Values whose text :func:`text_of` keeps (a thousand ranks' samples, most unchanged between scrapes)."""


class _Texts(dict[Any, str]):
    """``floatToGoString`` of the values seen lately. The text is a function of ``float(value)``,
    and equal numbers have equal floats, so equal values share a text; but for zero: ``-0.0``
    equals ``0`` and writes otherwise, so zeros are never kept (NaN equals nothing: never found)."""

    def __missing__(self, value: Any) -> str:
        text = go(value)
        if value != 0:
            if len(self) >= _GO_KEPT:
                self.clear()
            self[value] = text
        return text


text_of = _Texts().__getitem__
"""A sample value as prometheus_client's encoders write it, at a dictionary lookup when seen lately."""

Items = tuple[tuple[str, str], ...]
"""Label names and values of a sample, in the family's label order."""
Row = tuple[str, str, Items, Any]
"""A sample: (family name, sample name, label items, value)."""


class Rows:
    """Samples of a part as plain rows: what prometheus_client's ``add_metric`` would make
    (a gauge's sample is named as its family, a counter's ``_total``, an info's ``_info`` with
    value 1), without making a family or a sample object per value. Kept by family, in the order
    the families first came, as (sample name, [label items], [values]): one sample name per family
    (a family of several is given as a family); iterating gives rows (family, sample name, label
    items, value)."""

    __slots__ = ("groups",)

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.groups: dict[str, tuple[str, list[Items], list[Any]]] = {}
        for row in rows:
            self.append(row)

    def append(self, row: Row) -> None:
        family, name, items, value = row
        found = self.groups.get(family)
        if found is None:
            self.groups[family] = (name, [items], [value])
        elif found[0] != name:
            raise ValueError(f"{family}: samples {found[0]} and {name}; give such a family as a family")
        else:
            found[1].append(items)
            found[2].append(value)

    def __iter__(self) -> Iterator[Row]:
        for family, (name, items, values) in self.groups.items():
            for labels, value in zip(items, values):
                yield family, name, labels, value

    def __len__(self) -> int:
        return sum(len(group[1]) for group in self.groups.values())

    def __bool__(self) -> bool:
        return bool(self.groups)


