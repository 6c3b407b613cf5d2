"""One self-rewriting progress line on stderr for the command line's long waits
(``oomsight replay``, ``oomsight profile --wait``); silent when stderr is not a terminal,
so logs and pipes get no carriage returns."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO


class Progress:
    """``update(text)`` at most every ``interval_seconds``; ``done()`` ends the line."""

    def __init__(
        self,
        stream: Optional[TextIO] = None,
        interval_seconds: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream)
        self.interval_seconds = interval_seconds
        self.clock = clock
        self._last = float("-inf")
        self._width = 0

    def update(self, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if not force and now - self._last < self.interval_seconds:
            return
        self._last = now
        pad = " " * max(self._width - len(text), 0)
        self._width = len(text)
        self.stream.write(f"\r{text}{pad}")
        self.stream.flush()

    def done(self) -> None:
        """Clear the line (what follows prints on a clean line)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real file
        return False
