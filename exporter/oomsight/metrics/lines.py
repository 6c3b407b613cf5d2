"""A format's sample lines, written from heads learnt once (``oomsight.metrics.exposition``
keeps them per part).

prometheus_client writes a family as its header (``# HELP``, ``# TYPE``, ``# UNIT``) and then
one line per sample; a sample line is its head (name and labels) and then its value as
``floatToGoString`` writes it. :class:`Format` learns each head once, from the encoder's own line
for the sample with a sentinel value, and after that writes a part's lines from its
:class:`Shape` (the heads of all its samples, in order) with a value text each: a part whose
label sets did not change costs a handful of C-level passes over its samples, not a step per
family. Each format is checked when made: the encoder must write the values of a probe family
of hard values and label values as head and value, or :class:`Drift` is raised.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple, Optional, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from oomsight.metrics.rows import Items, Memo, Rows
from oomsight.metrics.rows import go as _go
from oomsight.metrics.rows import line_end_of as _end

Encoder = Callable[[Collector], bytes]
"""``prometheus_client.generate_latest``, its OpenMetrics twin, or what ``choose_encoder`` gives."""
Built = Union[Iterable[Metric], Rows]
"""What a part gives: prometheus_client families, or, lighter, :class:`Rows`."""


class Drift(Exception):
    """prometheus_client wrote text that does not cut into headers and sample lines."""


class Shape(NamedTuple):
    """A part's samples as last written in one format, each sample's family, label items, line
    head (its line before the value), value and line, in the order the part gave them."""

    families: list[str]
    items: list[Items]
    heads: list[str]
    values: list[Any]
    lines: list[str]


NO_SHAPE = Shape([], [], [], [], [])
Lines = tuple[list[str], list[str]]
"""A part's lines and the family of each, in the part's order (a family's lines keep their order)."""
_SENTINEL = 1.2345678901234567e-300
_SENTINEL_TEXT = _go(_SENTINEL)
_SEQUENCES_KEPT = 4096
_TYPES = frozenset(("gauge", "counter", "info"))
_NOTHING = (None, None, None)
"""A sample's timestamp, exemplar and native histogram."""


def families_of(built: Built, layout: dict[str, Metric]) -> list[Metric]:
    """A part's families: ``built`` itself, or its rows as families of ``layout`` (by name)."""
    if not isinstance(built, Rows):
        return list(built)
    out: dict[str, Any] = {}
    for family, name, items, value in built:
        found = out.get(family)
        if found is None:
            found = out[family] = empty(layout[family])
        found.samples.append(Sample(name, dict(items), value))
    return list(out.values())


class Only:
    """A collector of given families, then of ``others``."""

    def __init__(self, families: Iterable[Metric], others: Optional[Collector] = None) -> None:
        self.families = families
        self.others = others

    def collect(self) -> Iterator[Metric]:
        yield from self.families
        if self.others is not None:
            yield from self.others.collect()


def empty(family: Metric) -> Any:
    """A copy of ``family`` without samples (``copy.copy`` costs 4x: this runs 46 times a process)."""
    out = object.__new__(type(family))
    out.__dict__ = {**family.__dict__, "samples": []}
    return out


class Format:
    """One encoder's headers and end, the cutting of its text into sample lines, and the
    writing of a part's lines from its :class:`Shape`."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.end = encoder(Only([])).decode()
        """What the format writes after the last family (OpenMetrics: ``# EOF``)."""
        self._headers: dict[str, str] = {}
        self._sequences: Memo[tuple[str, ...], list[str]] = Memo(list, _SEQUENCES_KEPT)
        """The one list kept for a sequence of families: parts that give the same sequence give
        the same object, and are put in family order together (``oomsight.metrics.assembly``)."""
        self.rewritten = 0
        """Lines :meth:`write` wrote anew: a new sample's, or a changed value's."""
        probes = _probes()
        written: dict[str, str] = {}
        for name, line in zip(*self.write(probes, NO_SHAPE, {})[0]):
            written[name] = written.get(name, "") + line
        if written != self.lines(probes):
            raise Drift("the format does not write a sample as its head and then its value")

    def header(self, family: Metric) -> str:
        found = self._headers.get(family.name)
        if found is None:
            text = self.encoder(Only([empty(family)])).decode()
            if not text.endswith(self.end) or not text[: len(text) - len(self.end)].endswith("\n"):
                raise Drift(f"the header of {family.name} does not end a line before the format's end")
            found = self._headers[family.name] = text[: len(text) - len(self.end)]
        return found

    def lines(self, families: Iterable[Metric]) -> dict[str, str]:
        """The sample lines of every family that has samples, by name, from one encoder call."""
        present = [f for f in families if f.samples]
        if not present:
            return {}
        text = self.encoder(Only(present)).decode()
        heads = [self.header(f) for f in present]
        out, pos = {}, 0
        for i, family in enumerate(present):
            if not text.startswith(heads[i], pos):
                raise Drift(f"{family.name} does not start with its header")
            start = pos + len(heads[i])
            # a line never holds a raw newline (label values escape it) and no sample line starts
            # with "#": the next header is the first line that reads like it
            end = text.find("\n" + heads[i + 1], start - 1) + 1 if i + 1 < len(present) else len(text) - len(self.end)
            if end < start or (i + 1 == len(present) and text[end:] != self.end):
                raise Drift(f"the lines of {family.name} do not end where the next family starts")
            body = text[start:end]
            if body.count("\n") != len(family.samples):
                raise Drift(f"{family.name}: {len(family.samples)} samples did not give as many lines")
            out[family.name], pos = body, end
        return out

    def write(self, built: Built, known: Shape, layout: dict[str, Metric]) -> tuple[Lines, Shape]:
        """The lines of ``built`` (each family's as :meth:`lines` gives them), written from
        ``known`` (the part's last shape in this format) when its samples have the same families
        and label items (two list comparisons: a part's label sets rarely change), else from
        heads learnt again (one encoder call for those ``known`` lacks); and the new shape. A
        value equal to the one last written in its place keeps its line (equal numbers write
        alike; a -0.0 after a 0.0 keeps "0.0", the same number: no series of ours is ever
        negative zero)."""
        extra: Optional[dict[str, str]] = None
        if not isinstance(built, Rows):
            present = [f for f in built if f.samples]
            plain = [f for f in present if _plain(f)]
            extra = self.lines(f for f in present if not _plain(f))
            built = Rows((f.name, s.name, tuple(s.labels.items()), s.value) for f in plain for s in f.samples)
            layout = {f.name: f for f in plain}
        values = built.values
        if built.families == known.families and built.items == known.items:
            if values == known.values:
                shape = known
            else:
                was = zip(values, known.values, known.lines, known.heads)
                lines = [x if v == o else h + _end(v) for v, o, x, h in was]
                self.rewritten += sum(map(operator.ne, values, known.values))
                shape = Shape(known.families, known.items, known.heads, values, lines)
        else:
            heads = self._heads(built, known, layout)
            lines = list(map(operator.add, heads, map(_end, values)))
            shape = Shape(self._sequences[tuple(built.families)], built.items, heads, values, lines)
            self.rewritten += len(values)
        if extra:
            return ([*extra, *shape.families], [*extra.values(), *shape.lines]), shape
        return (shape.families, shape.lines), shape

    def _heads(self, built: Rows, known: Shape, layout: dict[str, Metric]) -> list[str]:
        """The line head of each sample of ``built``: those ``known`` has (by family and label
        items) taken from it, the others' learnt from the encoder's lines with the sentinel value."""
        kept = dict(zip(zip(known.families, known.items), known.heads))
        new = [(f, i) for f, i in zip(built.families, built.items) if (f, i) not in kept]
        if new:
            probes = families_of(Rows((f, built.name_of(f), i, _SENTINEL) for f, i in dict.fromkeys(new)), layout)
            learnt = self.lines(probes)
            for probe in probes:
                lines = learnt[probe.name].split("\n")[: len(probe.samples)]
                if not all(line.endswith(_SENTINEL_TEXT) for line in lines):
                    raise Drift(f"a sample of {probe.name} does not end with its value")
                for sample, line in zip(probe.samples, lines):
                    kept[probe.name, tuple(sample.labels.items())] = line[: -len(_SENTINEL_TEXT)]
        return list(map(kept.__getitem__, zip(built.families, built.items)))


def _plain(family: Metric) -> bool:
    """Samples as ``add_metric`` makes them for a gauge, counter or info: a name, labels and a
    value, nothing else (each line of such a family is a head and a value)."""
    return (
        family.type in _TYPES
        and all([s[2] is not None and s[3:] == _NOTHING for s in family.samples])
        and len({s.name for s in family.samples}) == 1
    )


def _probes() -> list[Metric]:
    """Families whose values (and label values) are hard to write: each format must write them
    as a head and ``floatToGoString``'s text."""
    values = (0, 0.0, -0.0, 1, -1, 2**53 + 1, 2**63 - 1, 0.1, 1e-7, 1234567.0, 1e21, -1e300, math.inf, -math.inf)
    gauge = GaugeMetricFamily("oomsight_probe", "Values.", labels=["i", "x"])
    counter = CounterMetricFamily("oomsight_probe_count", "Values.", labels=["i"])
    for i, v in enumerate((*values, math.nan, True)):
        gauge.add_metric([str(i), 'a"b\\c\nd é'], v)
        counter.add_metric([str(i)], abs(v))
    info = InfoMetricFamily("oomsight_probe_about", "Text.", labels=["x"])
    info.add_metric(["1"], {"y": '\\ " \n ü'})
    return [gauge, counter, info]
