"""The partition of an AppWrapper and the split of partitions between replicas (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared import subjects
from shared.partitions import assign, fnv1a, live, partition_of

members_st = st.sets(
    st.text(alphabet="abcdefghij0123456789-", min_size=1, max_size=12), min_size=1, max_size=9
)


def test_fnv1a_matches_the_published_test_vectors() -> None:
    assert fnv1a(b"") == 0x811C9DC5
    assert fnv1a(b"a") == 0xE40C292C
    assert fnv1a(b"foobar") == 0xBF9CF968


def test_partition_is_stable_and_in_range() -> None:
    assert partition_of("team-a", "llama", 16) == fnv1a(b"team-a/llama") % 16
    assert all(0 <= partition_of("ns", f"aw-{i}", 7) < 7 for i in range(200))


def test_partitions_spread_appwrappers_evenly() -> None:
    counts = [0] * 16
    for i in range(16_000):
        counts[partition_of("bench", f"aw-{i}", 16)] += 1
    assert min(counts) > 800 and max(counts) < 1200, counts


@given(count=st.integers(min_value=1, max_value=64), members=members_st)
def test_every_partition_has_exactly_one_owner_and_shares_are_balanced(count: int, members: set[str]) -> None:
    shares = assign(count, members)
    assert set(shares) == members
    owned = [p for share in shares.values() for p in share]
    assert sorted(owned) == list(range(count))
    cap = -(-count // len(members))
    assert all(len(share) <= cap for share in shares.values())


@given(count=st.integers(min_value=1, max_value=64), members=members_st)
def test_the_split_depends_only_on_the_set_of_members(count: int, members: set[str]) -> None:
    assert assign(count, sorted(members)) == assign(count, sorted(members, reverse=True))


def test_a_member_leaving_moves_its_own_partitions_and_few_others() -> None:
    before = assign(16, ["a", "b", "c", "d"])
    after = assign(16, ["a", "b", "c"])
    moved = sum(1 for m in ("a", "b", "c") for p in before[m] if p not in after[m])
    assert set().union(*after.values()) == set(range(16))
    # d's four partitions must move; balancing may move a few more, not a reshuffle.
    assert moved <= 4, (before, after)


def test_two_members_split_sixteen_partitions_eight_and_eight() -> None:
    shares = assign(16, ["health-0", "health-1"])
    assert sorted(len(s) for s in shares.values()) == [8, 8]


def test_live_members_are_those_heard_from_within_the_ttl() -> None:
    assert live({"a": 10.0, "b": 4.0, "c": 5.0}, now=10.0, ttl=5.0) == {"a", "c"}


def test_subjects_carry_the_partition_last() -> None:
    part = subjects.partition("ns", "aw")
    assert subjects.verdict("ns", "aw") == f"respawn.verdict.ns.aw.{part}"
    assert subjects.appwrapper_obs("ns", "aw", "pod", "p").endswith(f".pod.p.{part}")
    assert subjects.verdict_partition_filter(part) == f"respawn.verdict.*.*.{part}"
    assert subjects.appwrapper_obs_partition_filter(part) == f"respawn.obs.v1.aw.*.*.*.*.{part}"
    assert subjects.verdict_filter("ns", "aw") == "respawn.verdict.ns.aw.*"
