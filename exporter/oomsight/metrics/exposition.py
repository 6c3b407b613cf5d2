"""Exposition text written by prometheus_client part by part, and kept while a part's inputs
are unchanged (issue 13, "Incremental reads").

A scrape is a sequence of :class:`Part`\\ s over a fixed layout of families; each part gives
samples of some of them. prometheus_client writes a family as its header (``# HELP``,
``# TYPE``, ``# UNIT``) and then one line per sample, and a registry as its families in turn,
so the text of the merged families is, family by family of the layout, the header and then
the lines every part gave that family, in part order. Nothing here formats a line: each part
is rendered by the encoder itself, and its text is cut at the headers, which that encoder wrote
for the empty families. Where the cut does not add up (a prometheus_client that writes a family
differently), the scrape is rendered whole instead, and that is logged once.

A part's lines are kept under its key while its inputs are the same: the same objects (a
document the reader parsed again is a new object, whatever it holds) or equal plain values.
When they are not, the part is built again, and only its families whose samples differ from
the kept ones are rendered again (a snapshot written again changes a few of its 48 samples).
Parts missing from a scrape are forgotten with it, so the cache holds only what the last
scrape served, in at most :data:`MAX_FORMATS` formats.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any, Callable, NamedTuple, Optional

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

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
    build: Callable[[], Iterable[Metric]]


class Drift(Exception):
    """prometheus_client wrote text that does not cut into headers and sample lines."""


def merge(layout: Sequence[Metric], parts: Iterable[Part]) -> list[Metric]:
    """The families of ``layout``, each holding the samples every part gave it, in part order."""
    merged = {f.name: empty(f) for f in layout}
    for part in parts:
        for family in part.build():
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
    """One encoder's headers and end, and the cutting of its text into sample lines."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.end = encoder(_Only([]))
        """What the format writes after the last family (OpenMetrics: ``# EOF``)."""
        self._headers: dict[str, bytes] = {}

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


class _Kept:
    """A part's families (those with samples) and their lines in each format asked for."""

    def __init__(self, inputs: tuple[Any, ...], families: list[Metric]) -> None:
        self.inputs = inputs
        self.families = families
        self.lines: dict[str, dict[str, bytes]] = {}
        """Format -> family name -> sample lines."""
        self.complete: set[str] = set()
        """Formats whose lines hold every family."""

    def take_unchanged(self, old: _Kept) -> None:
        """Take ``old``'s lines of every family whose samples are the same: a snapshot written
        again changes a few of its process's 48 samples (the rest need not be rendered again)."""
        before = {f.name: f.samples for f in old.families}
        same = [f.name for f in self.families if _same_samples(f.samples, before.get(f.name))]
        for fmt, lines in old.lines.items():
            self.lines[fmt] = {name: lines[name] for name in same if name in lines}


def _same_samples(a: list[Any], b: Optional[list[Any]]) -> bool:
    """Samples that give the same lines: equal, and no value's sign flipped (0.0 and -0.0 are equal)."""
    return a == b and all(math.copysign(1.0, x.value) == math.copysign(1.0, y.value) for x, y in zip(a, b))


class ExpositionCache:
    """The text of every part of the last scrape, per format; thread-safe."""

    def __init__(self) -> None:
        self._formats: dict[str, _Format] = {}
        self._kept: dict[Hashable, _Kept] = {}
        self._lock = threading.Lock()
        self.rendered = 0
        """Families of keyed parts rendered so far (the others of each scrape were reused)."""
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
            found = self._formats[fmt] = _Format(encoder)
        return found

    def _render(self, layout: Sequence[Metric], parts: list[Part], form: _Format, fmt: str) -> bytes:
        chunks = {f.name: [form.header(f)] for f in layout}
        kept: dict[Hashable, _Kept] = {}
        for part in parts:
            for name, body in self._lines(part, form, fmt, kept).items():
                chunks[name].append(body)
        self._kept = kept
        return b"".join(itertools.chain.from_iterable(chunks.values()))

    def _lines(self, part: Part, form: _Format, fmt: str, kept: dict[Hashable, _Kept]) -> dict[str, bytes]:
        if part.key is None:
            return form.lines(part.build())
        old = self._kept.get(part.key)
        if old is not None and same_inputs(old.inputs, part.inputs):
            entry = old
        else:
            entry = _Kept(part.inputs, [f for f in part.build() if f.samples])
            if old is not None:
                entry.take_unchanged(old)
        kept[part.key] = entry
        lines = entry.lines.setdefault(fmt, {})
        if fmt not in entry.complete:
            missing = [f for f in entry.families if f.name not in lines]
            lines.update(form.lines(missing))
            self.rendered += len(missing)
            entry.complete.add(fmt)
        return lines
