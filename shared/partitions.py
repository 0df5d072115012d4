"""How replicas of one service split the AppWrappers between them: pure functions, no I/O.

Every AppWrapper belongs to one of ``count`` partitions, fixed for an installation
(``scaling.partitions``), by a hash of its namespace and name. The partition is the last token of
its observation and verdict subjects (:mod:`shared.subjects`), so a consumer can ask the stream for
one partition's messages. The replicas of a service that are alive (:mod:`shared.bus.membership`)
each compute the same :func:`assign` from the same member list and each takes its own share.

The hash is FNV-1a (32 bit) of ``<namespace>/<name>`` in UTF-8: stable across processes, Python
versions and machines (Python's ``hash`` of a string is salted per process).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["assign", "fnv1a", "live", "partition_of", "partitions_of", "rank"]

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


# Every watch event and every message asks for its AppWrapper's partition, and the hash walks the
# name byte by byte in Python: the answers of the AppWrappers seen lately are kept.
@functools.lru_cache(maxsize=1 << 16)
def partition_of(namespace: str, name: str, count: int) -> int:
    """The partition of the AppWrapper ``namespace/name`` among ``count``."""
    if count < 1:
        raise ValueError(f"partition count must be at least 1, got {count}")
    return fnv1a(f"{namespace}/{name}".encode()) % count


def rank(partition: int, member: str) -> int:
    """How much ``member`` wants ``partition`` (rendezvous hashing): each partition ranks the
    members the same way everywhere, whatever else is alive."""
    digest = hashlib.blake2b(f"{partition}/{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(count: int, members: Iterable[str]) -> dict[str, frozenset[int]]:
    """Which partitions each live member owns: every partition exactly one, shares balanced.

    Balanced rendezvous: partitions are handed out in order, each to the member that ranks it
    highest among those not yet full (a member holds at most ``ceil(count / len(members))``).
    When a member joins or leaves, a partition moves only if its place in that ranking changes,
    so most stay where they were; and the answer depends only on the set of members, so replicas
    that see the same members agree without talking to each other.
    """
    alive = sorted(set(members))
    if not alive:
        return {}
    cap = -(-count // len(alive))
    owned: dict[str, set[int]] = {m: set() for m in alive}
    for partition in range(count):
        for member in sorted(alive, key=lambda m: (-rank(partition, m), m)):
            if len(owned[member]) < cap:
                owned[member].add(partition)
                break
    return {m: frozenset(ps) for m, ps in owned.items()}


def live(last_seen: Mapping[str, float], now: float, ttl: float) -> set[str]:
    """The members heard from within ``ttl`` seconds of ``now`` (one clock, the caller's)."""
    return {member for member, seen in last_seen.items() if now - seen <= ttl}


def partitions_of(owned: Iterable[int]) -> str:
    """A short, sorted rendering for logs and metrics: ``0,3,5``."""
    return ",".join(str(p) for p in sorted(owned)) or "-"
