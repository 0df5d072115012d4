"""The Kubernetes layer loads its client library only when a connection is made.

kubernetes_asyncio's client package imports every generated model: about a third of a
service's imports. Health and autopilot never talk to the API server, so they must start
without it; the library's errors must still become :class:`KubeApiError` where it is used.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from shared.kube import KubeApiError
from shared.kube.client import Kube


@pytest.mark.parametrize("service", ["health", "autopilot"])
def test_a_service_that_never_calls_the_api_server_starts_without_the_client_library(service: str) -> None:
    probe = f"import sys, services.{service}.service; print('kubernetes_asyncio' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False", loaded.stderr


class _Refusing:
    """An ApiClient whose every call raises the library's own error."""

    async def call_api(self, *args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=409, reason="Conflict")


async def test_an_error_the_client_library_raises_is_a_kube_api_error() -> None:
    kube = Kube(_Refusing())  # type: ignore[arg-type]
    with pytest.raises(KubeApiError) as request_failed:
        await kube.request("PUT", "/api/v1/namespaces/t/configmaps/c", body={}, retry=None)
    assert request_failed.value.conflict
    with pytest.raises(KubeApiError) as watch_failed:
        async for _ in kube.stream_lines("/api/v1/pods", query={"watch": True}, request_timeout=1):
            pass
    assert watch_failed.value.status == 409
