"""Reading a JSON file that nobody vouches for: the spool is writable by every container of
the pod, so each file may be anything. Bounded in size and nesting before parsing, numbers
range-checked while parsing, strings checked after, and never blocking: the file is opened
with ``O_NOFOLLOW | O_NONBLOCK`` and its type checked on the open descriptor, so a FIFO or a
device swapped in after a ``stat`` cannot hang the reader.

Every failure is an :class:`Unusable` with one of the spool's skip reasons.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat as stat_mod
from typing import Any

MAX_DEPTH = 32
"""Our documents nest 5 deep; JSON nested deeper than this is not ours (and 1,000 levels
would reach Python's recursion limit in ``json.loads``)."""
INT_LIMIT = 2**63
"""Integers are within ±2**63: larger ones overflow float conversions (``OverflowError``)."""
_PASSING = ("EMFILE", "ENFILE", "ENOMEM", "EAGAIN", "EINTR", "ENOBUFS")
TRANSIENT_ERRNOS = frozenset(getattr(errno, name) for name in _PASSING if hasattr(errno, name))
"""Errors that say nothing about the file: the reader keeps the last good document."""
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class Unusable(Exception):
    """A file that cannot be used; ``reason`` is one of ``oomsight.wire.spool.SKIP_REASONS``."""

    def __init__(self, reason: str, detail: str, transient: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.transient = transient
        """An error of the moment (no file descriptors left, ...), not of the file."""


class _OutOfRange(ValueError):
    pass


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


def nesting_within(text: str, limit: int) -> bool:
    """True if the JSON ``text`` nests at most ``limit`` deep (and its brackets balance);
    each pass removes one level of innermost pairs, in C."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    for _ in range(limit):
        if not brackets:
            return True
        shorter = _INNERMOST.sub("", brackets)
        if len(shorter) == len(brackets):
            return False  # unbalanced: not JSON
        brackets = shorter
    return not brackets


def _parse_int(text: str) -> int:
    if len(text) > 20:
        raise _OutOfRange(f"an integer of {len(text)} digits")
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise _OutOfRange(f"integer {value} outside ±2**63")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"number {text[:40]} is not finite")
    return value


def _parse_constant(text: str) -> float:
    raise _OutOfRange(f"{text} is not a JSON number")


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


def decode(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw``: UTF-8, nested at most ``max_depth``, integers within ±2**63,
    finite numbers and no lone surrogates. Raises :class:`Unusable`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unusable("corrupt", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not nesting_within(text, max_depth):
        raise Unusable("corrupt", f"not JSON nested at most {max_depth} deep")
    try:
        doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _OutOfRange as exc:
        raise Unusable("invalid", str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise Unusable("corrupt", f"not JSON ({exc})") from None
    if _SURROGATE_ESCAPE.search(text) and not _strings_encodable(doc):
        raise Unusable("corrupt", "a string holds a lone surrogate (not Unicode text)")
    return doc


def load(path: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """:func:`read_file` then :func:`decode`."""
    raw, _ = read_file(path, max_bytes)
    return decode(raw, max_depth)
