"""Profile requests: small JSON documents in ``<spool>/requests/`` that ask every process of
a pod for a profiler window (``{"kind": "profile_request", "id", "steps", "start_step",
"created_at", "cuda_time"}``). The sidecar's admin endpoint and ``oomsight profile`` write
them; the hook's profiler reads them (``oomsight.hook.profiler``)."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from oomsight.wire import decoding
from oomsight.wire.schema import SCHEMA_VERSION, ProfileRequestDocument, SchemaError, validate
from oomsight.wire.spool import REQUESTS, write_atomic

KIND_PROFILE_REQUEST = "profile_request"
MAX_STEPS = 100
"""The longest window a request may ask for, in optimizer steps."""


class ProfileRequest:
    def __init__(self, rid: str, steps: int, start_step: int, created_at: float, cuda_time: bool = True) -> None:
        self.id = rid
        self.steps = steps
        self.start_step = start_step
        self.created_at = created_at
        self.cuda_time = cuda_time
        """False: a memory-only window: no CUDA time, and no Kineto where torch has the legacy profiler."""


def parse_request(doc: Any) -> Optional[ProfileRequest]:
    """A request document, or None if it is not a valid one (its table in ``oomsight.wire.fields``,
    then what the table cannot say: the id's characters and the window's length)."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND_PROFILE_REQUEST:
        return None
    try:
        validate(doc, fill_defaults=True)
    except SchemaError:
        return None
    req: ProfileRequestDocument = doc  # type: ignore[assignment]
    rid, steps = req["id"], req["steps"]
    if req["schema_version"] > SCHEMA_VERSION or not rid.replace("-", "").isalnum() or not 1 <= steps <= MAX_STEPS:
        return None
    return ProfileRequest(rid, steps, req["start_step"], float(req["created_at"]), req["cuda_time"])


def write_request(spool_dir: str, rid: str, steps: int, start_step: int, cuda_time: bool = True) -> str:
    """Write a profile request into the spool (used by the admin endpoint and the CLI)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND_PROFILE_REQUEST,
        "id": rid,
        "steps": steps,
        "start_step": start_step,
        "created_at": time.time(),
        "cuda_time": cuda_time,
    }
    folder = os.path.join(spool_dir, REQUESTS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"profile-{rid}.json")
    write_atomic(path, json.dumps(doc).encode(), durable=False)
    return path


def pending_requests(spool_dir: str, since: float, handled: set[str]) -> list[ProfileRequest]:
    """Requests created after ``since`` that this process has not handled yet."""
    folder = os.path.join(spool_dir, REQUESTS)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:  # never blocks: a FIFO swapped in here must not hang the hook's sampler
            req = parse_request(decoding.load(os.path.join(folder, name), 4096))
        except (OSError, decoding.Unusable):
            continue
        if req is not None and req.id not in handled and req.created_at >= since:
            found.append(req)
    return found
