"""The connections a server holds, and who goes when it is full: admission, eviction, fairness.

A :class:`ConnectionTable` is bookkeeping only: it never touches a socket, a selector or the
clock (times are given to it), so its rules are tested with plain objects
(``tests/test_connection_table.py``). The event loop (:mod:`oomsight_server.listener`) asks it
and then does the I/O:

* **admission**: a newcomer is taken while fewer than the cap are held (waiting, in a worker,
  or lingering after their answer), else room is made by eviction, else it is refused;
* **eviction**: a connection already answered and lingering goes first (it costs nobody
  anything); else the idlest (longest without a byte) of the client address that holds the
  most waiting connections;
* **fairness**: so a client flooding connections only ever loses its own, and one with a few
  (Prometheus, the kubelet, the API server) keeps them; past the bytes budget, the waiting
  connection holding the most bytes goes;
* **fair workers**: requests that arrived whole wait for a worker in one queue per client
  address, and workers take them round-robin over the clients, so a scraper with one
  connection waits for at most one request of each other client, whatever their number of
  connections (:meth:`ConnectionTable.next_ready`).
"""

from __future__ import annotations

import math
import selectors
import ssl
from collections import OrderedDict, deque
from typing import Any, Optional

NEVER = math.inf


class Connection:
    """One client connection: its socket, what it sent so far, its clock."""

    __slots__ = ("address", "buffer", "cut", "due", "events", "last_byte", "need", "sock", "tls_done")

    def __init__(self, sock: Any, address: Any, now: float, due: float) -> None:
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.last_byte = now
        self.due = due
        """When its request must have arrived whole (the request deadline)."""
        self.events = selectors.EVENT_READ
        self.tls_done = not isinstance(sock, ssl.SSLSocket)
        self.cut = False
        self.need = 0
        """Bytes of head and body to receive before a worker gets it; 0 while the head arrives."""


def peer(conn: Connection) -> str:
    """The client's address without its port: what one client holds is counted together."""
    address = conn.address
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


class ConnectionTable:
    """Every connection a server holds, in one of three states: **waiting** in the loop for its
    request, **busy** (queued for or in a worker), **lingering** (answered, draining before
    close); and the bytes the waiting ones hold."""

    def __init__(self) -> None:
        self.waiting: dict[Connection, None] = {}
        self._peers: dict[str, OrderedDict[Connection, None]] = {}  # the waiting by client, idlest first
        self.busy: set[Connection] = set()
        self.ready: OrderedDict[str, deque[Connection]] = OrderedDict()
        """The busy connections not yet taken by a worker, by client, in the order of their turns."""
        self.lingering: OrderedDict[Connection, None] = OrderedDict()
        self.buffered = 0
        """Bytes in the buffers of waiting connections."""

    def __len__(self) -> int:
        return len(self.waiting) + len(self.busy) + len(self.lingering)

    def full(self, cap: int) -> bool:
        """No room for a newcomer without closing one."""
        return len(self) >= cap

    def hold(self, conn: Connection) -> None:
        """Wait for its request; the newest activity of its client."""
        self.buffered += len(conn.buffer)
        self.waiting[conn] = None
        self._peers.setdefault(peer(conn), OrderedDict())[conn] = None

    def touch(self, conn: Connection, now: float) -> None:
        """Bytes arrived (a TLS handshake's too): it is the least idle of its client now."""
        conn.last_byte = now
        self._peers[peer(conn)].move_to_end(conn)

    def arrived(self, conn: Connection, data: bytes) -> None:
        conn.buffer += data
        self.buffered += len(data)

    def forget(self, conn: Connection) -> bool:
        """No longer held waiting or lingering (closed, closing, or handed to a worker); True if
        it was (its socket was in the loop's selector)."""
        if conn in self.waiting:
            self.buffered -= len(conn.buffer)
            del self.waiting[conn]
            key = peer(conn)
            mine = self._peers[key]
            del mine[conn]
            if not mine:
                del self._peers[key]
            return True
        if conn in self.lingering:
            del self.lingering[conn]
            return True
        return False

    def dispatch(self, conn: Connection) -> None:
        """Its request is whole: it waits for a worker behind the earlier ones of its client."""
        conn.need = 0
        self.forget(conn)
        self.busy.add(conn)
        self.ready.setdefault(peer(conn), deque()).append(conn)

    def next_ready(self) -> Optional[Connection]:
        """The request a free worker answers next: the oldest of the client whose turn it is,
        and that client's turn goes to the back; None if none waits."""
        if not self.ready:
            return None
        key, mine = next(iter(self.ready.items()))
        conn = mine.popleft()
        if mine:
            self.ready.move_to_end(key)
        else:
            del self.ready[key]
        return conn

    def returned(self, conn: Connection) -> None:
        """A worker is done with it."""
        self.busy.discard(conn)

    def linger(self, conn: Connection, until: float) -> None:
        """Answered; drained until ``until``, then closed."""
        conn.due = until
        self.lingering[conn] = None

    def victim(self) -> Optional[tuple[Connection, bool]]:
        """The connection to close to make room, and whether closing it refuses a client (a
        lingering one does not); None if none waits or lingers."""
        if self.lingering:
            return next(iter(self.lingering)), False
        if not self._peers:
            return None
        most = max(self._peers.values(), key=len)  # the client holding most pays, never one with a few
        return next(iter(most)), True

    def largest(self) -> Connection:
        """The waiting connection holding the most bytes (over the bytes budget, it goes)."""
        return max(self.waiting, key=lambda c: len(c.buffer))

    def expired(self, now: float, idle_seconds: float) -> list[tuple[Connection, bool]]:
        """Waiting connections past their request deadline (True) or silent for ``idle_seconds``."""
        return [(c, c.due <= now) for c in self.waiting if c.due <= now or c.last_byte + idle_seconds <= now]

    def drained(self, now: float) -> list[Connection]:
        """Lingering connections whose time is up."""
        return [c for c in self.lingering if c.due <= now]

    def cut_overdue(self, now: float) -> list[Connection]:
        """Busy connections whose request is still being read past its deadline, marked cut."""
        overdue = [c for c in self.busy if c.due <= now]
        for conn in overdue:
            conn.due, conn.cut = NEVER, True
        return overdue
