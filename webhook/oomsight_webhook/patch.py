"""A JSONPatch (RFC 6902) builder that only adds, never overwrites an array.

It remembers which arrays and maps it created earlier in the same patch, so the first
volume creates ``/spec/volumes`` and the next one appends with ``/spec/volumes/-``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

Op = dict[str, Any]


def pointer(*parts: object) -> str:
    """A JSON pointer from path segments, escaping ``~`` and ``/`` (``oomsight.io~1status``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class PatchBuilder:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._created: set[str] = set()

    def append(self, path: str, existing: Optional[list[Any]], item: Any) -> None:
        """Add ``item`` at the end of the array at ``path`` (``existing`` is its current value)."""
        if existing is None and path not in self._created:
            self._created.add(path)
            self.ops.append({"op": "add", "path": path, "value": [item]})
        else:
            self.ops.append({"op": "add", "path": path + "/-", "value": item})

    def put(self, path: str, existing: Optional[Mapping[str, Any]], key: str, value: Any) -> None:
        """Set ``key`` in the map at ``path`` (``existing`` is its current value)."""
        if existing is None and path not in self._created:
            self._created.add(path)
            self.ops.append({"op": "add", "path": path, "value": {key: value}})
        else:
            self.ops.append({"op": "add", "path": path + pointer(key), "value": value})

    def set(self, path: str, value: Any) -> None:
        """Set the map member at ``path``, there or not: an ``add`` (RFC 6902 4.1: an existing
        member is replaced), where a ``replace`` fails to apply if the member is missing."""
        self.ops.append({"op": "add", "path": path, "value": value})
