"""Reading a JSON file that nobody vouches for: the spool is writable by every container of
the pod, so each file may be anything. Bounded in size and nesting before parsing, strings
checked after (numbers are range-checked by validation), and never blocking: the file is opened
with ``O_NOFOLLOW | O_NONBLOCK`` and its type checked on the open descriptor, so a FIFO or a
device swapped in after a ``stat`` cannot hang the reader.

Every failure is an :class:`Unusable` with one of the spool's skip reasons.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat as stat_mod
from typing import Any, Optional

MAX_DEPTH = 32
"""Our documents nest 5 deep; JSON nested deeper than this is not ours (and 1,000 levels
would reach Python's recursion limit in ``json.loads``)."""
_PASSING = ("EMFILE", "ENFILE", "ENOMEM", "EAGAIN", "EINTR", "ENOBUFS")
TRANSIENT_ERRNOS = frozenset(getattr(errno, name) for name in _PASSING if hasattr(errno, name))
"""Errors that say nothing about the file: the reader keeps the last good document."""
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_KEEP = b'[]{}"'
_DROP = bytes(c for c in range(256) if c not in _KEEP)
_STRING = re.compile(rb'"[^"]*"')
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class Unusable(Exception):
    """A file that cannot be used; ``reason`` is one of ``oomsight.wire.spool.SKIP_REASONS``."""

    def __init__(self, reason: str, detail: str, transient: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.transient = transient
        """An error of the moment (no file descriptors left, ...), not of the file."""


def read_file(path: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (at most ``max_bytes``) and its ``fstat``.
    Raises :class:`Unusable`; ``FileNotFoundError`` when it vanished (a rename in flight)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unusable("foreign", "a symbolic link") from None
        raise Unusable("unreadable", str(exc), exc.errno in TRANSIENT_ERRNOS) from None
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            raise Unusable("foreign", "not a regular file")
        if st.st_size > max_bytes:
            raise Unusable("oversized", f"{st.st_size} bytes > {max_bytes}")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise Unusable("unreadable", str(exc), exc.errno in TRANSIENT_ERRNOS) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise Unusable("oversized", f"more than {max_bytes} bytes")
    return b"".join(chunks), st


def nesting_within(raw: bytes, limit: int) -> bool:
    """True if the JSON ``raw`` nests at most ``limit`` deep (and its brackets balance), read
    off its brackets outside strings in C passes over the bytes: each pass removes one level of
    innermost pairs (a snapshot's step rows go in the first)."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING.sub(b"", raw.translate(None, _DROP))
    for _ in range(limit):
        if not brackets:
            return True
        # the innermost pairs, each marked by a byte no pair can form around, then dropped
        shorter = brackets.replace(b"[]", b"0").replace(b"{}", b"0").translate(None, b"0")
        if len(shorter) == len(brackets):
            return False  # unbalanced: not JSON
        brackets = shorter
    return not brackets


def _strings_encodable(doc: Any) -> bool:
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def decode(raw: bytes, max_depth: Optional[int] = MAX_DEPTH) -> Any:
    """The JSON value of ``raw``: UTF-8, nested at most ``max_depth``, no lone surrogates.
    Raises :class:`Unusable`. Numbers are Python's (``NaN``, ``1e400`` and 400-digit integers
    parse): validation (``oomsight.wire.schema``) range-checks every number the table has,
    which is every number a reader uses; checking them here too would cost 5x the parse.
    ``max_depth=None`` leaves the nesting to validation, which bounds it (a third of the
    cost of a snapshot's parse): only for documents validated next. JSON nested past the
    parser's recursion limit is still corrupt."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unusable("corrupt", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if max_depth is not None and not nesting_within(raw, max_depth):
        raise Unusable("corrupt", f"not JSON nested at most {max_depth} deep")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise Unusable("corrupt", f"not JSON ({exc})") from None
    if _SURROGATE_ESCAPE.search(text) and not _strings_encodable(doc):
        raise Unusable("corrupt", "a string holds a lone surrogate (not Unicode text)")
    return doc


def load(path: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`read_file` then :func:`decode`."""
    raw, _ = read_file(path, max_bytes)
    return decode(raw, max_depth)
