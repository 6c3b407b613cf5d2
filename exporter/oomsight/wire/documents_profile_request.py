"""The ``TypedDict`` s of the ``profile_request`` document and of the objects first nested in it.
GENERATED from ``oomsight.wire.fields`` by ``python -m oomsight.wire.rendering``: edit the
table, not this file. Import them from ``oomsight.wire.documents``."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from typing_extensions import NotRequired

__all__ = [
    "ProfileRequestDocument",
]


class ProfileRequestDocument(TypedDict):
    """A request for a profiling window (requests/profile-<id>.json), by the admin endpoint or oomsight profile."""

    #: 1
    schema_version: NotRequired[int]
    #: "profile_request"
    kind: str
    #: letters, digits and -
    id: str
    #: the window's length in optimizer steps, 1 to 100
    steps: int
    #: start after this optimizer step (or at once when already past it)
    start_step: NotRequired[int]
    #: when it was written; a process handles requests created after it started
    created_at: float
    #: false asks for a memory-only window
    cuda_time: NotRequired[bool]
