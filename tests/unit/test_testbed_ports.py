"""The testbed's ports come from outside the kernel's ephemeral range, so that no outgoing
connection can take one between the pick and the bind."""

from __future__ import annotations

import itertools
import random
import socket

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
