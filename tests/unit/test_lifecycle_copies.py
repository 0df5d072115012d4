"""Lifecycle's copies of JSON trees equal their originals and share nothing that can change."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given

from services.lifecycle.copies import copy_json
from tests.unit.test_jsoncodec import same, values


@given(values)
def test_a_copied_tree_equals_the_original_and_shares_nothing_that_can_change(value: Any) -> None:
    copied = copy_json(value)
    assert same(copied, value)

    def containers(tree: Any) -> list[int]:
        if isinstance(tree, dict):
            return [id(tree), *(i for item in tree.values() for i in containers(item))]
        if isinstance(tree, list):
            return [id(tree), *(i for item in tree for i in containers(item))]
        return []

    assert not set(containers(copied)) & set(containers(value))


def test_what_is_not_json_in_a_tree_is_deep_copied_as_it_is() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    inner = {"k": [1]}
    original = {"t": (inner,), "when": when}
    copied = copy_json(original)
    assert copied == original and type(copied["t"]) is tuple
    assert copied["t"][0] is not inner
