"""The spool's folders and bounds, shared by its writer (``oomsight.wire.spool``) and its
reader (``oomsight.wire.reader``); ``docs/spool-format.md`` is the prose version."""

from __future__ import annotations

SNAPSHOTS = "snapshots"
EVENTS = "events"
ARTIFACTS = "artifacts"
TIMELINES = "timelines"
PROFILES = "profiles"
REQUESTS = "requests"
SUBDIRS = (SNAPSHOTS, EVENTS, ARTIFACTS, TIMELINES, PROFILES, REQUESTS)
TIMELINE_MAX_BYTES = 1024 * 1024
"""A timeline file is rotated to ``<id>.1.jsonl`` at this size: at most 2 MiB per process."""
MAX_FILE_BYTES = 1024 * 1024
"""Snapshots and events are a few KiB; anything over this is not ours."""

SKIP_REASONS = ("corrupt", "oversized", "foreign", "future_version", "invalid", "unreadable")
