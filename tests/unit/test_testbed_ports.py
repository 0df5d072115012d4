"""The testbed's ports come from outside the kernel's ephemeral range, so that no outgoing
connection can take one between the pick and the bind, and are reserved machine-wide, so that
no other testbed picks one meanwhile."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import random
import socket
import subprocess
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from respawn.testbed import ports


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32768\t60999\n", (32768, 60999)),
        ("1024 65535", (1024, 65535)),
        ("", (32768, 60999)),
        ("abc def", (32768, 60999)),
        ("60999 32768", (32768, 60999)),
        ("1 2 3", (32768, 60999)),
    ],
)
def test_ephemeral_range_is_read_or_defaults(text: str, expected: tuple[int, int]) -> None:
    assert ports.ephemeral_range(text) == expected


def test_candidates_lie_below_the_default_ephemeral_range() -> None:
    assert ports.candidate_range((32768, 60999)) == (10_000, 32767)


def test_candidates_lie_above_a_low_ephemeral_range() -> None:
    assert ports.candidate_range((10_000, 40_000)) == (40_001, 65535)


def test_no_candidates_when_the_ephemeral_range_takes_nearly_everything() -> None:
    assert ports.candidate_range((1024, 65000)) is None


def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    first, last = ports.ephemeral_range()
    span = ports.candidate_range((first, last))
    picked = [ports.free_port() for _ in range(50)]
    assert len(set(picked)) == len(picked), "a port was handed out twice"
    for port in picked:
        if span is not None:
            assert not first <= port <= last
            assert span[0] <= port <= span[1]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        # The busy port twice, then its neighbours: a neighbour, too, may be in use at the moment
        # (another testbed on the machine, a connection's local port), and must be skipped as well.
        offered = itertools.chain([busy, busy], range(busy + 1, 65536), range(1024, busy))
        monkeypatch.setattr(ports, "candidate_range", lambda _ephemeral: (1, 65535))
        monkeypatch.setattr(random, "randint", lambda _a, _b: next(offered))
        port = ports.free_port()
        assert port != busy
        assert not ports.port_in_use(port)


def test_a_port_reserved_by_another_live_process_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Testbeds started side by side pick their ports before binding them: a port another
    process picked and has not bound yet is skipped."""
    monkeypatch.setattr(ports, "RESERVATIONS", tmp_path)
    monkeypatch.setattr(ports, "port_in_use", lambda _port: False)
    monkeypatch.setattr(ports, "candidate_range", lambda _ephemeral: (20_000, 20_001))
    offered = iter([20_000, 20_000, 20_001])
    monkeypatch.setattr(random, "randint", lambda _a, _b: next(offered))
    (tmp_path / "20000").write_text("1")  # pid 1 is always alive
    assert ports.free_port() == 20_001
    assert (tmp_path / "20001").read_text() == str(os.getpid())


def test_a_reservation_of_a_dead_process_or_past_its_time_is_taken_over(tmp_path: Path) -> None:
    gone = _a_dead_pid()
    (tmp_path / "20000").write_text(str(gone))
    assert ports.reserve(20_000, directory=tmp_path)
    assert (tmp_path / "20000").read_text() == str(os.getpid())

    (tmp_path / "20001").write_text("1")
    now = time.time()
    assert not ports.reserve(20_001, directory=tmp_path, now=now)
    assert ports.reserve(20_001, directory=tmp_path, now=now + ports.RESERVATION_TTL + 1)


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _reserve_all(directory: str, first: int, count: int, won: Queue[list[int]], leave: Event) -> None:
    won.put([p for p in range(first, first + count) if ports.reserve(p, directory=Path(directory))])
    leave.wait(30)  # alive until every process has reported, so its reservations hold


def test_processes_racing_for_the_same_ports_each_get_a_distinct_share(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    won: Queue[list[int]] = ctx.Queue()
    leave = ctx.Event()
    procs = [
        ctx.Process(target=_reserve_all, args=(str(tmp_path), 21_000, 300, won, leave)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    try:
        shares = [won.get(timeout=30) for _ in procs]
    finally:
        leave.set()
        for p in procs:
            p.join(10)
    everything = [port for share in shares for port in share]
    assert sorted(everything) == list(range(21_000, 21_300)), "a port went to two processes or to none"
