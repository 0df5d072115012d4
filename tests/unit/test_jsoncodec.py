"""The hot paths' JSON reads and writes exactly what the standard library does, whatever a user's
object holds: wide integers, lone surrogates, deep nesting, keys that are not strings."""

from __future__ import annotations

import json
import math
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import jsoncodec

# Any JSON value: integers of any width (an AppWrapper's template may hold one), any text
# (surrogates included), finite floats.
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal, with types: 1 and 1.0 are not the same JSON value here (a wide integer read as a
    float would pass ==)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


@settings(max_examples=400)
@given(values)
def test_what_the_standard_library_writes_is_read_as_it_reads_it(value: Any) -> None:
    for raw in (
        json.dumps(value).encode(),
        json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        try:
            expected = json.loads(raw)
        except ValueError:
            with pytest.raises(ValueError):
                jsoncodec.loads(raw)
            continue
        assert same(jsoncodec.loads(raw), expected)


@settings(max_examples=400)
@given(values)
def test_what_is_written_is_read_back_unchanged(value: Any) -> None:
    assert same(jsoncodec.loads(jsoncodec.dumps(value)), json.loads(json.dumps(value)))


@given(values)
def test_the_sorted_form_is_canonical(value: Any) -> None:
    """Two dicts with the same items in another order encode to the same bytes (fingerprints)."""

    def reverse(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: reverse(v[k]) for k in reversed(list(v))}
        if isinstance(v, list):
            return [reverse(x) for x in v]
        return v

    assert jsoncodec.dumps(value, sort_keys=True) == jsoncodec.dumps(reverse(value), sort_keys=True)


@pytest.mark.parametrize(
    "number",
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**40)],
)
def test_integers_of_any_width_are_read_exactly(number: int) -> None:
    decoded = jsoncodec.loads(json.dumps({"replicas": number}).encode())
    assert type(decoded["replicas"]) is int and decoded["replicas"] == number
    assert jsoncodec.loads(jsoncodec.dumps({"replicas": number})) == {"replicas": number}


def test_keys_that_are_not_strings_are_written_as_the_standard_library_writes_them() -> None:
    assert json.loads(jsoncodec.dumps({1: "a", None: "b"})) == json.loads(json.dumps({1: "a", None: "b"}))


def test_what_no_decoder_reads_fails_as_the_standard_library_fails() -> None:
    with pytest.raises(ValueError):
        jsoncodec.loads(b"{not json")
    with pytest.raises(ValueError):
        jsoncodec.loads(b"\xff\xfe")
    with pytest.raises(RecursionError):
        jsoncodec.loads(b"[" * 100_000 + b"]" * 100_000)
    # What json takes beyond the standard, it still takes.
    assert math.isnan(jsoncodec.loads(b"NaN"))


def test_nesting_beyond_the_fast_encoders_limit_is_written_by_the_standard_library() -> None:
    value: Any = "x"
    for _ in range(300):
        value = {"a": value}
    assert json.loads(jsoncodec.dumps(value)) == value


@given(values)
def test_packed_bytes_are_the_same_json(value: Any) -> None:
    assert jsoncodec.pack(value) == jsoncodec.dumps(value)


def test_packed_bytes_take_their_own_size_in_memory() -> None:
    """What caches keep for long must not occupy orjson's working buffer (up to twice its
    length): thousands of kept objects would double a service's memory."""
    pod = {"items": [{"name": f"container-{i}", "image": "x" * 90, "ready": True} for i in range(32)]}
    size = len(jsoncodec.dumps(pod))
    assert 4200 < size < 5000  # orjson grows its buffer to 8 KB for it

    def traced(make: Any) -> float:
        tracemalloc.start()
        try:
            kept = [make(pod) for _ in range(200)]
            allocated = sum(s.size for s in tracemalloc.take_snapshot().statistics("filename"))
        finally:
            tracemalloc.stop()
        assert len(kept) == 200
        return allocated / 200

    assert traced(jsoncodec.pack) < size * 1.1
    # What it guards against: the unpacked form (orjson's buffer) takes markedly more.
    assert traced(jsoncodec.dumps) > size * 1.5
