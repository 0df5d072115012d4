"""shared.kube.client.decode_body: an answer the client cannot read is one API error, never a
RecursionError or ValueError escaping the caller's handlers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.kube import KubeApiError
from shared.kube.client import decode_body


def test_an_object_reads_as_itself() -> None:
    assert decode_body(b'{"kind": "Pod", "metadata": {"name": "p"}}', "GET x") == {
        "kind": "Pod",
        "metadata": {"name": "p"},
    }


def test_an_object_nested_deeper_than_the_default_recursion_limit_still_reads() -> None:
    # A LIST page with one such object must not lose every other object on the page.
    depth = 5_000
    data = decode_body(b'{"items": [' + b'{"a":' * depth + b"1" + b"}" * depth + b', {"b": 2}]}', "LIST")
    assert data["items"][1] == {"b": 2}


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'{"a":' * 20_000 + b"1" + b"}" * 20_000, "nested too deeply"),
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
    ],
)
def test_what_cannot_be_read_is_an_undecodable_api_error_naming_the_request(raw: bytes, says: str) -> None:
    with pytest.raises(KubeApiError) as info:
        decode_body(raw, "GET /apis/x")
    assert info.value.reason == "Undecodable"
    assert "GET /apis/x" in info.value.message and says in info.value.message


@given(st.binary(max_size=200))
def test_no_bytes_raise_anything_but_an_api_error(raw: bytes) -> None:
    try:
        decode_body(raw, "GET y")
    except KubeApiError as exc:
        assert exc.reason == "Undecodable"
