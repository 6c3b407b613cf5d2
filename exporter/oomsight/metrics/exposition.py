"""Exposition text written part by part, and kept while a part's inputs are unchanged
(issue 13, "Incremental reads").

A scrape is a sequence of :class:`Part`\\ s over a fixed layout of families; each part gives
samples of some of them, as prometheus_client families or, lighter, as :class:`Rows`.
prometheus_client writes a family as its header (``# HELP``, ``# TYPE``, ``# UNIT``) and then
one line per sample, and a registry as its families in turn, so the text of the merged families
is, family by family of the layout, the header and then the lines every part gave that family,
in part order. The headers are the encoder's own text for the empty families. A sample line is
its head (name and labels) and then its value as prometheus_client's ``floatToGoString`` writes
it: the heads of a family are learnt once from the encoder's own lines for its samples (with a
sentinel value), and kept by position while the part gives that family the same label sets; a
family whose values are the same keeps its text, and a changed value costs one
``floatToGoString`` (none for a value seen lately) and no encoder call. Each format is checked
when first asked for (a probe family of hard values and label values must come out of the
encoder as head and value); where
that or a cut does not add up (a prometheus_client that writes a family differently), the
scrape is rendered whole by the encoder instead, and that is logged once.

A part's lines are kept under its key while its inputs are the same: the same objects (the
reader gives a file's unchanged parts as the objects it gave before) or equal plain values.
When they are not, the part is built and written again from its kept heads. Parts missing
from a scrape are forgotten with it, so the cache holds only what the last scrape served, in
at most :data:`MAX_FORMATS` formats.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from oomsight.metrics.rows import Items, Rows
from oomsight.metrics.rows import go as _go
from oomsight.metrics.rows import text_of as _text

logger = logging.getLogger(__name__)
Encoder = Callable[[Collector], bytes]
"""``prometheus_client.generate_latest``, its OpenMetrics twin, or what ``choose_encoder`` gives."""
MAX_FORMATS = 4
"""Formats kept at once (text, OpenMetrics, their escaping variants); a fifth starts afresh."""
_PLAIN = (int, str, bool, type(None))


class Part(NamedTuple):
    """Samples of some families that are a function of ``inputs`` alone."""

    key: Optional[Hashable]
    """Where its text is kept between scrapes; None: rendered on every scrape."""
    inputs: tuple[Any, ...]
    build: Callable[[], Built]


Built = Union[Iterable[Metric], Rows]


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


class Drift(Exception):
    """prometheus_client wrote text that does not cut into headers and sample lines."""


def merge(layout: Sequence[Metric], parts: Iterable[Part]) -> list[Metric]:
    """The families of ``layout``, each holding the samples every part gave it, in part order."""
    by_name = {f.name: f for f in layout}
    merged = {f.name: empty(f) for f in layout}
    for part in parts:
        for family in families_of(part.build(), by_name):
            merged[family.name].samples.extend(family.samples)
    return list(merged.values())


def same_inputs(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Inputs that give the same text: the same objects, or equal ints, strings, booleans, None."""
    return len(a) == len(b) and all(
        x is y or (type(x) is type(y) and type(x) in _PLAIN and x == y) for x, y in zip(a, b)
    )


class _Only:
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


class _Format:
    """One encoder's headers and end, and the cutting of its text into sample lines.

    A sample line is its head (name and labels, as the encoder writes them) and then its value
    as ``floatToGoString`` writes it: the head of each (name, labels) is learnt once, from the
    encoder's own line for the sample with the value :data:`_SENTINEL`, and kept by the caller;
    the encoder writes the values of a probe family the same way, or :class:`Drift` is raised
    when the format is made."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.end = encoder(_Only([]))
        """What the format writes after the last family (OpenMetrics: ``# EOF``)."""
        self._headers: dict[str, bytes] = {}
        self.rewritten = 0
        """Families whose lines :meth:`write` wrote anew (the others kept their last text)."""
        probes = _probes()
        if self.write(probes, {}, {})[0] != self.lines(probes):
            raise Drift("the format does not write a sample as its head and then its value")

    def header(self, family: Metric) -> bytes:
        found = self._headers.get(family.name)
        if found is None:
            text = self.encoder(_Only([empty(family)]))
            if not text.endswith(self.end) or not text[: len(text) - len(self.end)].endswith(b"\n"):
                raise Drift(f"the header of {family.name} does not end a line before the format's end")
            found = self._headers[family.name] = text[: len(text) - len(self.end)]
        return found

    def lines(self, families: Iterable[Metric]) -> dict[str, bytes]:
        """The sample lines of every family that has samples, by name, from one encoder call."""
        present = [f for f in families if f.samples]
        if not present:
            return {}
        text = self.encoder(_Only(present))
        heads = [self.header(f) for f in present]
        out, pos = {}, 0
        for i, family in enumerate(present):
            if not text.startswith(heads[i], pos):
                raise Drift(f"{family.name} does not start with its header")
            start = pos + len(heads[i])
            # a line never holds a raw newline (label values escape it) and no sample line starts
            # with "#": the next header is the first line that reads like it
            end = text.find(b"\n" + heads[i + 1], start - 1) + 1 if i + 1 < len(present) else len(text) - len(self.end)
            if end < start or (i + 1 == len(present) and text[end:] != self.end):
                raise Drift(f"the lines of {family.name} do not end where the next family starts")
            body = text[start:end]
            if body.count(b"\n") != len(family.samples):
                raise Drift(f"{family.name}: {len(family.samples)} samples did not give as many lines")
            out[family.name], pos = body, end
        return out

    def write(self, built: Built, known: Heads, layout: dict[str, Metric]) -> tuple[dict[str, bytes], Heads]:
        """What :meth:`lines` gives for ``built``, written from the heads in ``known``; also the
        heads of these samples. A family whose label sets are those of ``known``'s, in the same
        order (one list comparison: a part's label sets rarely change), is written from its kept
        heads by position; the others' heads are learnt with one encoder call."""
        out: dict[str, bytes] = {}
        if not isinstance(built, Rows):
            present = [f for f in built if f.samples]
            plain = [f for f in present if _plain(f)]
            out.update(self.lines(f for f in present if not _plain(f)))
            built = Rows((f.name, s.name, tuple(s.labels.items()), s.value) for f in plain for s in f.samples)
            layout = {f.name: f for f in plain}
        heads: Heads = {}
        new = Rows()
        for family, (name, items, values) in built.groups.items():
            found = known.get(family)
            if found is None or found[0] != name or found[1] != items:
                for row in zip(items, values):
                    new.append((family, name, *row))
            elif found[3] == values:  # nothing moved: the same text (equal numbers write alike; a -0.0
                # after a 0.0 keeps "0.0", the same number: no series of ours is ever negative zero)
                heads[family] = found
                out[family] = found[4]
            else:
                out[family] = text = _written(found[2], values)
                heads[family] = (name, items, found[2], values, text)
                self.rewritten += 1
        if new:
            self._learn(new, layout, heads)
            for family, (name, items, values) in new.groups.items():
                kept = heads[family][2]
                out[family] = text = _written(kept, values)
                heads[family] = (name, items, kept, values, text)
                self.rewritten += 1
        return out, heads

    def _learn(self, rows: Rows, layout: dict[str, Metric], heads: Heads) -> None:
        """The heads of ``rows``' families, from the encoder's lines for them with the sentinel value."""
        probes = families_of(Rows((f, n, items, _SENTINEL) for f, n, items, _ in rows), layout)
        learnt = self.lines(probes)
        for probe in probes:
            name, items, _ = rows.groups[probe.name]
            lines = learnt[probe.name].decode().split("\n")[: len(items)]
            if not all(line.endswith(_SENTINEL_TEXT) for line in lines):
                raise Drift(f"a sample of {probe.name} does not end with its value")
            heads[probe.name] = (name, list(items), [line[: -len(_SENTINEL_TEXT)] for line in lines], None, b"")


def _written(heads: list[str], values: list[Any]) -> bytes:
    """A family's sample lines: each head, then its value as prometheus_client writes it."""
    return "".join([h + _text(v) + "\n" for h, v in zip(heads, values)]).encode()


Heads = dict[str, tuple[str, list[Items], list[str], Optional[list[Any]], bytes]]
"""Family -> its sample name, its samples' label items, the text of each line before the value,
and the values last written with their text, in one format."""
_SENTINEL = 1.2345678901234567e-300
_SENTINEL_TEXT = _go(_SENTINEL)
_TYPES = frozenset(("gauge", "counter", "info"))
_NOTHING = (None, None, None)
"""A sample's timestamp, exemplar and native histogram."""


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


class _Kept:
    """A part's inputs, how it is built, and its lines and line heads in each format asked for."""

    def __init__(self, inputs: tuple[Any, ...], build: Callable[[], Built]) -> None:
        self.inputs = inputs
        self.build = build
        self.lines: dict[str, dict[str, bytes]] = {}
        """Format -> family name -> sample lines."""
        self.heads: dict[str, Heads] = {}
        """Format -> the heads of the part's samples (a process's label sets do not change)."""


class ExpositionCache:
    """The text of every part of the last scrape, per format; thread-safe."""

    def __init__(self) -> None:
        self._formats: dict[str, _Format] = {}
        self._kept: dict[Hashable, _Kept] = {}
        self._fresh: dict[str, Heads] = {}
        """Format -> the line heads of the part rendered on every scrape."""
        self._lock = threading.Lock()
        self.rendered = 0
        """Families of keyed parts whose text was new in their scrape (the others were reused)."""
        self.drifted = 0
        """Scrapes rendered whole since a cut did not add up (:class:`Drift`): then every one is."""

    def __len__(self) -> int:
        return len(self._kept)

    def render(
        self,
        layout: Sequence[Metric],
        parts: Iterable[Part],
        encoder: Encoder,
        fmt: str,
        others: Optional[Collector] = None,
    ) -> bytes:
        """``encoder`` over the merged families of ``parts`` and then ``others``; ``fmt`` names what
        the encoder writes (its content type): text kept for one format never serves another."""
        parts = list(parts)
        with self._lock:
            try:
                if self.drifted:
                    raise Drift("an earlier scrape did not cut")
                return self._render(layout, parts, self._format(encoder, fmt), fmt) + (
                    encoder(others) if others is not None else self._formats[fmt].end
                )
            except Drift as exc:
                self._formats.pop(fmt, None)
                self._kept.clear()
                self._fresh.clear()
                if not self.drifted:
                    logger.warning("oomsight: scrapes are rendered whole from now on, without the cache (%s)", exc)
                self.drifted += 1
        return encoder(_Only(merge(layout, parts), others))

    def _format(self, encoder: Encoder, fmt: str) -> _Format:
        found = self._formats.get(fmt)
        if found is None:
            if len(self._formats) >= MAX_FORMATS:
                self._formats.clear()
                self._kept.clear()
                self._fresh.clear()
            found = self._formats[fmt] = _Format(encoder)
        return found

    def _render(self, layout: Sequence[Metric], parts: list[Part], form: _Format, fmt: str) -> bytes:
        chunks = {f.name: [form.header(f)] for f in layout}
        by_name = {f.name: f for f in layout}
        kept: dict[Hashable, _Kept] = {}
        for part in parts:
            for name, body in self._lines(part, (form, fmt, by_name), kept).items():
                chunks[name].append(body)
        self._kept = kept
        return b"".join(itertools.chain.from_iterable(chunks.values()))

    def _lines(
        self, part: Part, to: tuple[_Format, str, dict[str, Metric]], kept: dict[Hashable, _Kept]
    ) -> dict[str, bytes]:
        form, fmt, layout = to
        if part.key is None:
            lines, self._fresh[fmt] = form.write(part.build(), self._fresh.get(fmt, {}), layout)
            return lines
        old = self._kept.get(part.key)
        if old is not None and same_inputs(old.inputs, part.inputs):
            entry = kept[part.key] = old
            found = entry.lines.get(fmt)
            if found is not None:
                return found
        else:
            entry = kept[part.key] = _Kept(part.inputs, part.build)
            if old is not None:
                entry.heads = dict(old.heads)
        rewritten = form.rewritten
        lines, entry.heads[fmt] = form.write(entry.build(), entry.heads.get(fmt, {}), layout)
        entry.lines[fmt] = lines
        self.rendered += form.rewritten - rewritten
        return lines
