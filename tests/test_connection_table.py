"""The listener's connection table without sockets: admission, eviction and fairness as plain
bookkeeping (``oomsight_server.connection``); the event loop over real sockets is
``tests/test_server_limits.py`` and ``tests/test_connection_attacks.py``."""

from __future__ import annotations

from oomsight_server.connection import NEVER, Connection, ConnectionTable


def conn(host: str, port: int = 1, now: float = 0.0, due: float = 30.0) -> Connection:
    return Connection(object(), (host, port), now, due)


def test_a_table_is_full_at_its_cap_counting_waiting_busy_and_lingering_connections():
    table = ConnectionTable()
    a, b, c = conn("10.0.0.1"), conn("10.0.0.2"), conn("10.0.0.3")
    for each in (a, b, c):
        table.hold(each)
    table.dispatch(b)
    table.forget(c)
    table.linger(c, until=2.0)
    assert (len(table.waiting), len(table.busy), len(table.lingering)) == (1, 1, 1)
    assert table.full(3) and not table.full(4)


def test_a_lingering_connection_goes_first_and_closing_it_refuses_nobody():
    table = ConnectionTable()
    waiting, answered = conn("10.0.0.1"), conn("10.0.0.2")
    table.hold(waiting)
    table.linger(answered, until=2.0)
    assert table.victim() == (answered, False)


def test_the_client_holding_the_most_loses_its_idlest_and_a_client_with_a_few_keeps_them():
    table = ConnectionTable()
    prometheus = conn("10.0.0.9")
    flood = [conn("10.0.0.66", port) for port in range(1, 6)]
    table.hold(prometheus)
    for each in flood:
        table.hold(each)
    table.touch(flood[0], now=5.0)  # bytes arrived: no longer its client's idlest
    assert table.victim() == (flood[1], True)
    for _ in range(4):
        victim, refused = table.victim()  # type: ignore[misc]
        assert victim is not prometheus and refused
        table.forget(victim)
    assert table.victim() in ((prometheus, True), (flood[0], True))


def test_no_victim_when_every_connection_holds_a_whole_request():
    table = ConnectionTable()
    busy = conn("10.0.0.1")
    table.hold(busy)
    table.dispatch(busy)
    assert table.victim() is None and table.full(1)


def test_bytes_held_follow_arrivals_and_leave_with_the_connection():
    table = ConnectionTable()
    small, large = conn("10.0.0.1"), conn("10.0.0.2")
    table.hold(small)
    table.hold(large)
    table.arrived(small, b"GET")
    table.arrived(large, b"POST /mutate HTTP/1.1\r\n")
    assert table.buffered == 3 + 23
    assert table.largest() is large
    assert table.forget(large) is True and table.buffered == 3
    assert table.forget(large) is False  # already gone: nothing to unregister


def test_the_sweep_finds_deadlines_idle_connections_drained_lingerers_and_overdue_workers():
    table = ConnectionTable()
    late, idle, fresh = conn("a", due=10.0), conn("b", due=99.0), conn("c", now=19.0, due=99.0)
    for each in (late, idle, fresh):
        table.hold(each)
    assert sorted(table.expired(now=20.0, idle_seconds=15.0), key=lambda x: x[0].address) == [
        (late, True),
        (idle, False),
    ]
    gone = conn("d")
    table.linger(gone, until=20.0)
    assert table.drained(now=19.0) == [] and table.drained(now=20.0) == [gone]
    worker = conn("e", due=20.0)
    table.hold(worker)
    table.dispatch(worker)
    assert table.cut_overdue(now=19.0) == []
    assert table.cut_overdue(now=20.0) == [worker] and worker.cut and worker.due == NEVER
    table.returned(worker)
    assert worker not in table.busy
