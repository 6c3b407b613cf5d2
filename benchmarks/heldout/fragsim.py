"""Replay ``naive_kv_server``'s allocations through a model of PyTorch's CUDA caching allocator (large pool).

    python benchmarks/heldout/fragsim.py

Model: block sizes rounded to 512 B; a request takes the smallest cached free block that fits (ties: lowest
address) and splits it when more than 1 MiB would remain; otherwise a new segment (exact size rounded to
2 MiB for >= 10 MiB) is reserved if that stays under the cap, else all entirely-free segments are released
and it is tried again, else OOM. Freed blocks merge with free neighbours of their segment. With expandable
segments, what matters is live bytes + the partly used 20 MiB pages around live blocks, which the sim
reports at the failing request.
"""

from __future__ import annotations

import sys

from wl_memory import FRAG_CAP_GIB, GIB, MIB, kv_server_events


def simulate() -> int:
    cap = FRAG_CAP_GIB * GIB
    segs: list[list[list]] = []  # segment -> ordered blocks [size, owner or None]
    where: dict[str, tuple[int, int]] = {}
    reserved = live = 0

    def free_blocks():  # type: ignore[no-untyped-def]
        for si, seg in enumerate(segs):
            if seg is None:
                continue
            off = 0
            for bi, (size, owner) in enumerate(seg):
                if owner is None:
                    yield size, si, off, bi
                off += size

    for ev in kv_server_events():
        if ev[0] == "alloc":
            size = -(-ev[2] // 512) * 512
            fits = sorted((s, si, off, bi) for s, si, off, bi in free_blocks() if s >= size)
            if not fits:
                seg_size = -(-size // (2 * MIB)) * (2 * MIB)
                if reserved + seg_size > cap:
                    for si, seg in enumerate(segs):
                        if seg is not None and len(seg) == 1 and seg[0][1] is None:
                            reserved -= seg[0][0]
                            segs[si] = None  # type: ignore[call-overload]
                if reserved + seg_size > cap:
                    holes = sorted((s for s, *_ in free_blocks()), reverse=True)
                    print(f"OOM on {ev[1]} ({size / GIB:.2f} GiB): live {live / GIB:.2f} GiB, reserved "
                          f"{reserved / GIB:.2f} GiB, free in cache {sum(holes) / GIB:.2f} GiB, largest hole "
                          f"{holes[0] / GIB if holes else 0:.2f} GiB, {len(holes)} holes; with expandable segments "
                          f"it needs <= {(live + size + 2 * 20 * MIB * len(holes)) / GIB:.2f} GiB of {FRAG_CAP_GIB}")
                    return 1
                segs.append([[seg_size, None]])
                reserved += seg_size
                fits = [(seg_size, len(segs) - 1, 0, 0)]
            bsize, si, _off, bi = fits[0]
            seg = segs[si]
            seg[bi] = [size, ev[1]]
            if bsize - size > MIB:
                seg.insert(bi + 1, [bsize - size, None])
            else:
                seg[bi][0] = bsize
            where[ev[1]] = (si, bi)
            live += seg[bi][0]
        elif ev[0] == "free":
            si = next(i for i, s in enumerate(segs) if s is not None and any(b[1] == ev[1] for b in s))
            seg = segs[si]
            bi = next(i for i, b in enumerate(seg) if b[1] == ev[1])
            live -= seg[bi][0]
            seg[bi][1] = None
            if bi + 1 < len(seg) and seg[bi + 1][1] is None:
                seg[bi][0] += seg.pop(bi + 1)[0]
            if bi > 0 and seg[bi - 1][1] is None:
                seg[bi - 1][0] += seg.pop(bi)[0]
    print(f"no OOM: reserved {reserved / GIB:.2f} GiB at the end")
    return 0


if __name__ == "__main__":
    sys.exit(simulate())
