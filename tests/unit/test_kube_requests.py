"""What the Kubernetes layer counts each request as: the API server's own verbs and resources."""

from __future__ import annotations

import pytest

from shared.kube.client import request_kind


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        (
            "GET",
            "/apis/workload.codeflare.dev/v1beta2/namespaces/team/appwrappers/a",
            None,
            ("get", "appwrappers"),
        ),
        ("GET", "/apis/workload.codeflare.dev/v1beta2/appwrappers", {"limit": 500}, ("list", "appwrappers")),
        ("GET", "/apis/batch/v1/jobs", {"watch": True, "labelSelector": "x"}, ("watch", "jobs")),
        ("GET", "/api/v1/namespaces/team/pods", {"watch": "true"}, ("watch", "pods")),
        ("GET", "/api/v1/nodes/n1", None, ("get", "nodes")),
        ("GET", "/api/v1/namespaces/team", None, ("get", "namespaces")),
        ("GET", "/api/v1/namespaces", None, ("list", "namespaces")),
        ("GET", "/apis/batch/v1", None, ("get", "discovery")),
        ("GET", "/api/v1", None, ("get", "discovery")),
        (
            "PUT",
            "/apis/workload.codeflare.dev/v1beta2/namespaces/t/appwrappers/a/status",
            None,
            ("update", "appwrappers/status"),
        ),
        (
            "PATCH",
            "/apis/workload.codeflare.dev/v1beta2/namespaces/t/appwrappers/a",
            None,
            ("patch", "appwrappers"),
        ),
        ("POST", "/api/v1/namespaces/t/events", {"dryRun": "All"}, ("create", "events")),
        ("DELETE", "/api/v1/namespaces/t/pods/p", None, ("delete", "pods")),
        ("PATCH", "/api/v1/namespaces/t/pods/p/status", None, ("patch", "pods/status")),
    ],
)
def test_requests_are_named_as_the_api_server_names_them(
    method: str, path: str, query: dict[str, str | int | bool] | None, expected: tuple[str, str]
) -> None:
    assert request_kind(method, path, query) == expected
