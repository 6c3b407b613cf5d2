"""A model of PyTorch's CUDA caching allocator, replayed over a list of tensor allocations.

``oomsight predict`` traces a training step without a GPU (``oomsight.predict``):
what it learns is the order in which tensors of which sizes are created and freed. This
module turns that order into what ``torch.cuda.max_memory_allocated()`` and
``max_memory_reserved()`` would report, following the allocator's documented rules
(``c10/cuda/CUDACachingAllocator.cpp``; constants in ``c10/core/AllocatorConfig.h``):

* every request is rounded up to a multiple of 512 bytes (at least 512);
* requests of at most 1 MiB come from the small pool, packed into 2 MiB segments; larger
  ones from the large pool: 1-10 MiB requests get a 20 MiB segment, larger ones a segment
  rounded up to 2 MiB;
* a request takes the smallest free cached block of its pool that fits (best fit, lowest
  address among equals); a block is split when what remains is at least 512 bytes (small
  pool) or more than 1 MiB (large pool), else the whole block is handed out and counts as
  allocated;
* a freed block merges with free neighbours of its segment; segments are never returned
  to the driver, except when a new segment would exceed the process cap
  (``set_per_process_memory_fraction``): then every wholly free segment is released and
  the request retried, and if it still does not fit, that is the OOM;
* with ``expandable_segments`` each pool is one segment that grows by pages (2 MiB small,
  20 MiB large), and any remainder of at least 512 bytes is split off.

One stream is modelled (a training step on the default stream); ``max_split_size_mb`` and
``roundup_power2_divisions`` are not (their defaults are off).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from typing import Optional

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


class SimulatedOom(Exception):
    """The request that would not fit under the cap."""

    def __init__(self, size: int, reserved: int, cap: int) -> None:
        super().__init__(f"{size} bytes requested with {reserved} reserved under a cap of {cap}")
        self.size, self.reserved, self.cap = size, reserved, cap


def round_size(size: int) -> int:
    """The block size a request of ``size`` bytes takes before any split decision."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def segment_size(size: int) -> int:
    """The ``cudaMalloc`` size when no cached block fits a rounded request of ``size``."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: Optional[_Block] = None
    next: Optional[_Block] = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class _Pool:
    small: bool
    free: list[tuple[int, int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int, int], _Block] = field(default_factory=dict)

    def add(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.free, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = block.key()
        del self.free[bisect.bisect_left(self.free, key)]
        del self.blocks[key]

    def best_fit(self, size: int) -> Optional[_Block]:
        i = bisect.bisect_left(self.free, (size, -1, -1))
        return self.blocks[self.free[i]] if i < len(self.free) else None


@dataclass
class Stats:
    """What ``torch.cuda.memory_stats()`` would say at the end of the replay."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    requested: int = 0
    segments: int = 0
    device_allocs: int = 0


class CachingAllocator:
    """``malloc(size)`` returns a handle, ``free(handle)`` gives it back; ``stats`` follows."""

    def __init__(self, cap: Optional[int] = None, expandable_segments: bool = False) -> None:
        self.cap = cap
        self.expandable = expandable_segments
        self.stats = Stats()
        self._pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self._segments: dict[int, tuple[bool, int]] = {}  # id -> (small, size)
        self._tails: dict[bool, _Block] = {}  # expandable: the last block of each pool's segment
        self._live: dict[int, tuple[_Block, int]] = {}
        self._ids = itertools.count(1)

    def malloc(self, size: int) -> int:
        """Allocate ``size`` bytes; 0 for an empty request (the allocator hands out no block)."""
        if size <= 0:
            return 0
        rounded = round_size(size)
        small = rounded <= SMALL_SIZE
        pool = self._pools[small]
        block = pool.best_fit(rounded)
        if block is None:
            block = self._grow(pool, rounded)
        else:
            pool.remove(block)
        block = self._split(pool, block, rounded)
        block.free = False
        handle = next(self._ids)
        self._live[handle] = (block, size)
        st = self.stats
        st.allocated += block.size
        st.requested += size
        st.peak_allocated = max(st.peak_allocated, st.allocated)
        return handle

    def free(self, handle: int) -> None:
        """Give a block back; it merges with free neighbours of its segment."""
        if handle == 0:
            return
        block, size = self._live.pop(handle)
        self.stats.allocated -= block.size
        self.stats.requested -= size
        block.free = True
        pool = self._pools[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                pool.remove(neighbour)
                block = self._merge(block, neighbour)
        pool.add(block)

    def live_handles(self) -> list[int]:
        return list(self._live)

    # segments -------------------------------------------------------------------------

    def _grow(self, pool: _Pool, rounded: int) -> _Block:
        if self.expandable:
            return self._expand(pool, rounded)
        size = segment_size(rounded)
        self._reserve(size)
        seg = next(self._ids)
        self._segments[seg] = (pool.small, size)
        self.stats.segments += 1
        return _Block(segment=seg, offset=0, size=size, small=pool.small, free=True)

    def _reserve(self, size: int) -> None:
        st = self.stats
        if self.cap is not None and st.reserved + size > self.cap:
            self._release_free_segments()
            if st.reserved + size > self.cap:
                raise SimulatedOom(size, st.reserved, self.cap)
        st.reserved += size
        st.device_allocs += 1
        st.peak_reserved = max(st.peak_reserved, st.reserved)

    def _release_free_segments(self) -> None:
        """What the allocator does before giving up: return every wholly free segment."""
        for pool in self._pools.values():
            for key in [k for k, b in pool.blocks.items() if b.prev is None and b.next is None]:
                block = pool.blocks[key]
                if self.expandable:
                    continue  # pages of a growing segment are not modelled as released
                pool.remove(block)
                self._segments.pop(block.segment, None)
                self.stats.reserved -= block.size
                self.stats.segments -= 1

    def _expand(self, pool: _Pool, rounded: int) -> _Block:
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        tail = self._tails.get(pool.small)
        have = tail.size if tail is not None and tail.free else 0
        grow = page * -(-(rounded - have) // page)
        self._reserve(grow)
        if tail is not None and tail.free:
            pool.remove(tail)
            tail.size += grow
            return tail
        seg = self._segments_key(pool.small)
        offset = 0 if tail is None else tail.offset + tail.size
        block = _Block(segment=seg, offset=offset, size=grow, small=pool.small, free=True, prev=tail)
        if tail is not None:
            tail.next = block
        self._tails[pool.small] = block
        return block

    def _segments_key(self, small: bool) -> int:
        seg = 1 if small else 2
        if seg not in self._segments:
            self._segments[seg] = (small, 0)
            self.stats.segments += 1
        return seg

    # blocks -------------------------------------------------------------------------

    def _split(self, pool: _Pool, block: _Block, rounded: int) -> _Block:
        remaining = block.size - rounded
        split = remaining >= MIN_BLOCK if self.expandable or pool.small else remaining > SMALL_SIZE
        if not split:
            return block
        rest = _Block(
            segment=block.segment,
            offset=block.offset + rounded,
            size=remaining,
            small=block.small,
            free=True,
            prev=block,
            next=block.next,
        )
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = rounded
        if self._tails.get(block.small) is block:
            self._tails[block.small] = rest
        pool.add(rest)
        return block

    def _merge(self, block: _Block, neighbour: _Block) -> _Block:
        first, second = (neighbour, block) if neighbour.offset < block.offset else (block, neighbour)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        if self._tails.get(first.small) is second:
            self._tails[first.small] = first
        return first
