"""The sidecar's C heap (issue 49): what a poisoned spool made it allocate goes back once the spool is clean.

glibc gives each thread that allocates an arena of its own (up to eight per core), and keeps the free pages
of an arena instead of giving them back to the kernel. The sidecar's threads (the HTTP server's, the Event
poster, the claims reader) allocate in turns under one lock, so their arenas only multiply what a burst of
parsing leaves behind: a spool of 10,000 mutated documents and 100,000 junk files left the real sidecar
at 112 MiB after the junk was removed, from 73 MiB. So the sidecar keeps one arena (:func:`one_arena`, at
start, before any thread) and gives free pages back after a scrape or an Event poster's tick, at most every
:data:`TRIM_INTERVAL_SECONDS` (:class:`Trim`). Where the C library is not glibc, nothing is done but the collection.

What is left over the baseline once the junk is gone (about 20 MiB) is CPython's small-object arenas, each kept by
any object still in it, which ``malloc_trim`` cannot reach. A full ``gc.collect()`` before each trim frees the
cycles a burst left (a failed parse's exception and its frames) before the sidecar's high collection threshold
would (``oomsight_sidecar.main.GC_THRESHOLD``): 2 to 4 MiB less in each of three runs, and a lower peak
(``benchmarks/results/scrape_budget.json``, ``this_tree_heap_remedies``).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most arenas (``malloc.h``)."""
TRIM_INTERVAL_SECONDS = 10.0
"""Free pages are given back at most this often: ``malloc_trim`` walks the heap (7 ms over 90 MB of scattered
blocks on a loaded 2-core machine, added to the scrape that calls it)."""


def _glibc() -> Optional[Any]:
    """The process's C library where it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc alone has it
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


def one_arena() -> bool:
    """One malloc arena for the whole process; call before any thread starts. False where not glibc."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, 1))


class Trim:
    """Collect the cyclic garbage, then give the C heap's free pages back to the kernel, at most every
    ``interval_seconds`` (a call in between does nothing): after a scrape and after an Event poster's tick."""

    def __init__(self, interval_seconds: float = TRIM_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.collections = 0
        """Full collections made, for tests."""
        self.trims = 0
        """Times the heap was trimmed, for tests."""
        self._libc = _glibc()
        self._at = -float("inf")
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            now = self.clock()
            if now - self._at < self.interval_seconds:
                return
            self._at = now
        gc.collect()
        self.collections += 1
        if self._libc is not None:
            self._libc.malloc_trim(0)
            self.trims += 1
