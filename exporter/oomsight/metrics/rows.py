"""A part's samples as plain rows, and their values as prometheus_client writes them
(``oomsight.metrics.exposition`` writes the lines)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any, Callable, TypeVar

from prometheus_client.utils import floatToGoString as _float_to_go

go: Callable[[Any], str] = _float_to_go
"""A sample value as prometheus_client's encoders write it."""
_EXACT = 2**53
"""Ints below this are floats exactly: their text follows from their digits."""
_EXPONENTS = {digits: go(10 ** (digits - 1))[1:] for digits in range(7, 17)}
"""An int of so many digits (10**6 and up) is written as its digits with a point after the first
and this exponent, as ``go`` writes a power of ten of that size (``e+09``)."""


def _fast_go(value: Any) -> str:
    """``go(value)`` for the values of most samples (byte counts, times, ratios) without its float
    round trip and branches: an int below 2**53 (or a float that is one) from its digits, a finite
    float below 10**6 by ``repr`` (no exponent to add); others by ``go`` itself."""
    kind = type(value)
    if kind is float and value - value == 0.0:  # finite
        if value < 1_000_000:  # at most six digits before the point: no exponent
            return repr(value)
        if value >= _EXACT or not value.is_integer():
            return go(value)
        value, kind = int(value), int
    if kind is int and -_EXACT < value < _EXACT:
        digits = str(value)
        if value < 1_000_000:
            return digits + ".0"
        rest = digits[1:].rstrip("0")
        return (digits[0] + "." + rest if rest else digits[0]) + _EXPONENTS[len(digits)]
    return go(value)


def _checked(fast: Callable[[Any], str]) -> Callable[[Any], str]:
    """``fast`` if it writes every kind of value as ``go`` does, else ``go`` (another release of
    prometheus_client may write values otherwise)."""
    probes: list[Any] = [0, 1, -1, 7, 999_999, 10**6, 10**6 + 1, 7_360_741_376, 7_000_000_000, 150_109_880_320]
    probes += [_EXACT - 1]
    probes += [-(10**7), -_EXACT + 1, _EXACT, _EXACT + 1, 0.0, -0.0, 0.5, 0.05, 1e-7, 5e-324, 30.024156991999995]
    probes += [999_999.5, 123_456.789, -1e300, -2.5, 1_000_000.0, 7.36e9, 2.0**53 - 1, 2.0**53, 1796296954.52, 1e21]
    probes += [math.inf, -math.inf, math.nan, True, False]
    return fast if all(fast(v) == go(v) for v in probes) else go


value_text = _checked(_fast_go)
"""A sample's value as prometheus_client writes it (``go``), faster for the usual values."""
_GO_KEPT = 65536
"""Values whose text :func:`line_end_of` keeps (a thousand ranks' samples, most unchanged between scrapes)."""


class _LineEnds(dict[Any, str]):
    """``floatToGoString`` of the values seen lately, then a newline. The text is a function of
    ``float(value)``, and equal numbers have equal floats, so equal values share a text; but for
    zero: ``-0.0`` equals ``0`` and writes otherwise, so zeros are never kept (NaN equals nothing:
    never found)."""

    def __missing__(self, value: Any) -> str:
        text = value_text(value) + "\n"
        if value != 0:
            if len(self) >= _GO_KEPT:
                self.clear()
            self[value] = text
        return text


line_end_of = _LineEnds().__getitem__
"""What ends a sample's line: its value as prometheus_client's encoders write it, and a newline;
a dictionary lookup for a value seen lately."""

K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V]):
    """``make(key)`` for the keys seen lately, made once each; at most ``limit`` kept (full, it
    starts afresh). Interning (``make`` the identity) gives equal keys one object, so comparing
    what was made last scrape with what is made now is mostly an identity check."""

    def __init__(self, make: Callable[[K], V], limit: int) -> None:
        super().__init__()
        self._make = make
        self._limit = limit

    def __missing__(self, key: K) -> V:
        value = self._make(key)
        if len(self) >= self._limit:
            self.clear()
        self[key] = value
        return value


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
