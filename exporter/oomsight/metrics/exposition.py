"""Exposition text written part by part, and kept while a part's inputs are unchanged
(issue 13, "Incremental reads").

A scrape is a sequence of :class:`Part`\\ s over a fixed layout of families; each part gives
samples of some of them, as prometheus_client families or, lighter, as :class:`Rows`.
prometheus_client writes a family as its header and then one line per sample, and a registry
as its families in turn, so the text of the merged families is, family by family of the
layout, the header and then the lines every part gave that family, in part order. The headers
are the encoder's own text for the empty families; a part's lines are written by
``oomsight.metrics.lines`` from the heads it learnt once from the encoder. Where a cut does not
add up (a prometheus_client that writes a family differently), the scrape is rendered whole by
the encoder instead, and that is logged once.

A part's lines are kept under its key while its inputs are equal (mostly the same objects: the
reader gives a file's unchanged parts as the objects it gave before).
When they are not, the part is built and written again from its kept shape. Parts missing
from a scrape are forgotten with it, so the cache holds only what the last scrape served, in
at most :data:`MAX_FORMATS` formats.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Callable, NamedTuple, Optional

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from oomsight.metrics.assembly import assemble, grouped
from oomsight.metrics.lines import NO_SHAPE, Built, Drift, Encoder, Format, Lines, Only, Shape, empty, families_of

__all__ = ["Built", "Encoder", "ExpositionCache", "Part", "merge", "same_inputs"]

logger = logging.getLogger(__name__)
MAX_FORMATS = 4
"""Formats kept at once (text, OpenMetrics, their escaping variants); a fifth starts afresh."""


class Part(NamedTuple):
    """Samples of some families that are a function of ``inputs`` alone."""

    key: Optional[Hashable]
    """Where its text is kept between scrapes; None: rendered on every scrape."""
    inputs: tuple[Any, ...]
    build: Callable[[], Built]


def merge(layout: Sequence[Metric], parts: Iterable[Part]) -> list[Metric]:
    """The families of ``layout``, each holding the samples every part gave it, in part order."""
    by_name = {f.name: f for f in layout}
    merged = {f.name: empty(f) for f in layout}
    for part in parts:
        for family in families_of(part.build(), by_name):
            merged[family.name].samples.extend(family.samples)
    return list(merged.values())


def same_inputs(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Inputs that give the same text: the same objects (the reader gives a file's unchanged parts
    as the objects it gave before) or equal values. A part is a function of its inputs alone, so
    equal inputs give equal text; a NaN is unequal to itself and only builds the part again."""
    return a == b


class _Kept:
    """A part's inputs, how it is built, and its lines and line heads in each format asked for."""

    def __init__(self, inputs: tuple[Any, ...], build: Callable[[], Built]) -> None:
        self.inputs = inputs
        self.build = build
        self.lines: dict[str, Lines] = {}
        """Format -> the part's lines and their families."""
        self.shapes: dict[str, Shape] = {}
        """Format -> the shape of the part's samples (a process's label sets do not change)."""


class ExpositionCache:
    """The text of every part of the last scrape, per format; thread-safe."""

    def __init__(self) -> None:
        self._formats: dict[str, Format] = {}
        self._kept: dict[Hashable, _Kept] = {}
        self._fresh: dict[str, Shape] = {}
        """Format -> the shape of the part rendered on every scrape."""
        self._lock = threading.Lock()
        self.rendered = 0
        """Lines of keyed parts written anew: a new sample's or a changed value's (the others were reused)."""
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
                form = self._format(encoder, fmt)
                text = self._render(layout, parts, form, fmt)
                return (text + form.end).encode() if others is None else text.encode() + encoder(others)
            except Drift as exc:
                self._formats.pop(fmt, None)
                self._kept.clear()
                self._fresh.clear()
                if not self.drifted:
                    logger.warning("oomsight: scrapes are rendered whole from now on, without the cache (%s)", exc)
                self.drifted += 1
        return encoder(Only(merge(layout, parts), others))

    def _format(self, encoder: Encoder, fmt: str) -> Format:
        found = self._formats.get(fmt)
        if found is None:
            if len(self._formats) >= MAX_FORMATS:
                self._formats.clear()
                self._kept.clear()
                self._fresh.clear()
            found = self._formats[fmt] = Format(encoder)
        return found

    def _render(self, layout: Sequence[Metric], parts: list[Part], form: Format, fmt: str) -> str:
        by_name = {f.name: f for f in layout}
        kept: dict[Hashable, _Kept] = {}
        to = (form, fmt, by_name)
        groups = grouped([self._lines(part, to, kept) for part in parts])
        self._kept = kept
        return assemble({f.name: form.header(f) for f in layout}, groups)

    def _lines(self, part: Part, to: tuple[Format, str, dict[str, Metric]], kept: dict[Hashable, _Kept]) -> Lines:
        form, fmt, layout = to
        if part.key is None:
            lines, self._fresh[fmt] = form.write(part.build(), self._fresh.get(fmt, NO_SHAPE), layout)
            return lines
        old = self._kept.get(part.key)
        if old is not None and same_inputs(old.inputs, part.inputs):
            entry = kept[part.key] = old
            found = entry.lines.get(fmt)
            if found is not None:
                return found
        elif old is not None:  # built again from its shapes; its lines of other formats are stale
            entry = kept[part.key] = old
            entry.inputs, entry.build, entry.lines = part.inputs, part.build, {}
        else:
            entry = kept[part.key] = _Kept(part.inputs, part.build)
        rewritten = form.rewritten
        lines, entry.shapes[fmt] = form.write(entry.build(), entry.shapes.get(fmt, NO_SHAPE), layout)
        entry.lines[fmt] = lines
        self.rendered += form.rewritten - rewritten
        return lines
