"""The groups the suite's workers run (tests/groups.py)."""

from __future__ import annotations

from pathlib import Path

from tests.groups import HOST_GROUP, HOST_MODULES, LONGEST_FIRST, group_of, start_rank

REPO = Path(__file__).resolve().parents[2]


def test_every_host_module_exists_so_a_renamed_one_is_not_left_to_run_beside_the_others() -> None:
    missing = sorted(m for m in HOST_MODULES if not (REPO / m).is_file())
    assert missing == []


def test_the_host_modules_share_one_group_and_every_other_module_is_a_group_of_its_own() -> None:
    assert {group_of(f"{m}::test_x[1]") for m in HOST_MODULES} == {HOST_GROUP}
    assert group_of("tests/integration/test_chaos.py::test_a") == "tests/integration/test_chaos.py"
    assert group_of("tests/unit/test_model.py::TestX::test_y[a::b]") == "tests/unit/test_model.py"


def test_every_module_named_longest_first_exists() -> None:
    missing = sorted(g for g in LONGEST_FIRST if g != HOST_GROUP and not (REPO / g).is_file())
    assert missing == []


def test_the_host_group_starts_first_then_the_long_modules_in_order_then_the_rest() -> None:
    ids = [
        "tests/unit/test_model.py::test_a",
        "tests/integration/test_kueue_e2e.py::test_b",
        "tests/integration/test_real_node.py::test_c",
        "tests/integration/test_chaos.py::test_d",
        "tests/integration/test_watcher.py::test_e",
    ]
    assert sorted(ids, key=start_rank) == [
        "tests/integration/test_real_node.py::test_c",
        "tests/integration/test_chaos.py::test_d",
        "tests/integration/test_kueue_e2e.py::test_b",
        "tests/unit/test_model.py::test_a",
        "tests/integration/test_watcher.py::test_e",
    ]
