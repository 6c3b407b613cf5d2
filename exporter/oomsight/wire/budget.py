"""The GPU memory budget document: the shares a pod claimed through DRA, as the sidecar last read them.

The sidecar (``oomsight_sidecar.claims``) writes it into the spool's ``sidecar/`` folder each time it
reads the pod's ResourceClaims, so ``oomsight report`` on a copied spool shows the budget next to the
measured peaks. One document, one writer (:func:`write`), one reader (:func:`read`); the reader
accepts keys it does not know and skips entries it cannot read, and a missing or broken file is no
budget: a spool from a pod without a claim, or from an older sidecar, reads as before.

``{"version": 1, "read_at": <unix seconds>, "budgets": [{"claim", "request", "driver", "dra_device",
"memory_bytes"}]}``
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from oomsight.wire.spool import write_atomic

FOLDER = "sidecar"
"""The sidecar's own folder in the spool (its OOM ledger and posted-events state live there too)."""
FILE = "dra-budget.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Budget:
    """The memory one claim grants the pod on one device."""

    claim: str
    request: str
    driver: str
    dra_device: str
    """``<pool>/<device>``: how DRA names the device (a claim carries no GPU UUID)."""
    memory_bytes: int


def path(spool_dir: str) -> str:
    return os.path.join(spool_dir, FOLDER, FILE)


def write(spool_dir: str, budgets: Sequence[Budget], now: float | None = None) -> None:
    """Replace the document (atomically); an empty list is written too: the claim went away."""
    doc = {
        "version": VERSION,
        "read_at": time.time() if now is None else now,
        "budgets": [dataclasses.asdict(b) for b in budgets],
    }
    os.makedirs(os.path.join(spool_dir, FOLDER), exist_ok=True)
    write_atomic(path(spool_dir), json.dumps(doc, sort_keys=True).encode(), durable=False)


def read(spool_dir: str) -> list[Budget]:
    """The budgets of the document; none where it is missing, unreadable or not this format."""
    try:
        with open(path(spool_dir), "rb") as fh:
            doc = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return []
    entries = doc.get("budgets") if isinstance(doc, dict) else None
    return [b for b in (_budget(e) for e in entries or []) if b is not None] if isinstance(entries, list) else []


def _budget(entry: Any) -> Budget | None:
    if not isinstance(entry, dict):
        return None
    memory = entry.get("memory_bytes")
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
        return None
    claim, request, driver, device = (entry.get(k, "") for k in ("claim", "request", "driver", "dra_device"))
    if not all(isinstance(n, str) for n in (claim, request, driver, device)):
        return None
    return Budget(str(claim), str(request), str(driver), str(device), memory)
