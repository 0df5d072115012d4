"""Which AppWrappers the watcher takes for torn down (their objects' changes not published)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.watcher.teardown import TornDown

KEY = ("ns", "aw")


def test_an_appwrapper_is_torn_down_from_its_deletion_until_a_while_after_it_is_gone() -> None:
    t = TornDown(remember_gone=60.0)
    t.learn(KEY, deleting=False, deleted=False, now=0.0)
    assert not t.holds(KEY, 0.0)
    t.learn(KEY, deleting=True, deleted=False, now=1.0)
    # However long its deletion takes, while it is there with its deletionTimestamp.
    assert t.holds(KEY, 1.0) and t.holds(KEY, 10_000.0)
    t.learn(KEY, deleting=True, deleted=True, now=100.0)
    assert t.holds(KEY, 100.0) and t.holds(KEY, 160.0)
    assert not t.holds(KEY, 160.5)
    assert not t.holds(("ns", "other"), 100.0)


def test_an_appwrapper_created_again_under_the_same_name_is_not_torn_down() -> None:
    t = TornDown()
    t.learn(KEY, deleting=True, deleted=False, now=0.0)
    t.learn(KEY, deleting=True, deleted=True, now=1.0)
    t.learn(KEY, deleting=False, deleted=False, now=2.0)
    assert not t.holds(KEY, 2.0)
    assert len(t) == 0


def test_an_appwrapper_deleted_without_its_deletion_seen_is_torn_down_too() -> None:
    # Deleted at once (no finalizer), or while the watch was away: only the DELETED event comes.
    t = TornDown(remember_gone=60.0)
    t.learn(KEY, deleting=False, deleted=True, now=5.0)
    assert t.holds(KEY, 5.0) and not t.holds(KEY, 66.0)


@given(st.lists(st.tuples(st.integers(0, 20), st.booleans(), st.booleans(), st.floats(0, 50)), max_size=200))
def test_what_is_gone_is_forgotten_after_the_memory_so_it_never_grows_without_bound(
    events: list[tuple[int, bool, bool, float]],
) -> None:
    t = TornDown(remember_gone=10.0)
    now = 0.0
    for name, deleting, deleted, step in events:
        now += step
        t.learn(("ns", str(name)), deleting=deleting, deleted=deleted, now=now)
    # One more event, long after: every AppWrapper gone earlier is forgotten; only those still
    # being deleted (there, with a deletionTimestamp) are held.
    t.learn(("ns", "late"), deleting=False, deleted=False, now=now + 11.0)
    still_deleting = {k for k in (("ns", str(n)) for n in range(21)) if t.holds(k, float("inf"))}
    assert len(t) == len(still_deleting)
