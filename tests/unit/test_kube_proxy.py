"""The Kubernetes client resolves the environment's proxy once (not per request)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp.connector
import pytest
from aiohttp import web

from shared.kube import Kube
from shared.kube.client import KEEPALIVE, env_proxy

API = "https://10.0.0.1:6443"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_no_proxy_variables_means_no_proxy() -> None:
    assert env_proxy(API) is None


def test_https_proxy_is_used_for_an_https_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert env_proxy(API) == "http://proxy.example:3128"
    assert env_proxy("http://10.0.0.1:8080") is None  # only HTTPS_PROXY is set


def test_no_proxy_exempts_the_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,10.0.0.1")
    assert env_proxy(API) is None
    assert env_proxy("https://api.example:6443") == "http://proxy.example:3128"


async def test_the_session_no_longer_reads_the_environment_per_request(
    tmp_path: Path,
) -> None:
    """aiohttp's trust_env re-reads proxies and ~/.netrc on every request; it is off."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    kube = await Kube.connect(kubeconfig)
    try:
        assert kube.api.rest_client.pool_manager.trust_env is False
    finally:
        await kube.close()


async def test_a_connection_idle_for_longer_than_aiohttps_default_is_used_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp closes a connection idle for 15 s; the pool keeps it for KEEPALIVE, so that the
    next request after a quiet spell pays no new handshake."""
    clients: list[tuple[str, int]] = []

    async def answer(request: web.Request) -> web.Response:
        clients.append(request.transport.get_extra_info("peername") if request.transport else ("", 0))
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    app = web.Application()
    app.router.add_get("/api", answer)
    runner = web.AppRunner(app, keepalive_timeout=300)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    kube = await Kube.connect(kubeconfig)
    try:
        await kube.request("GET", "/api")
        # Twice aiohttp's default later, as the pool (time.monotonic) and its cleanup timer (the
        # event loop's clock) see it.
        loop = asyncio.get_running_loop()
        real_loop, real_monotonic = loop.time, time.monotonic
        monkeypatch.setattr(loop, "time", lambda: real_loop() + 30.0)
        monkeypatch.setattr(aiohttp.connector, "monotonic", lambda: real_monotonic() + 30.0)
        await asyncio.sleep(0.05)
        await kube.request("GET", "/api")
        assert KEEPALIVE > 30.0
        assert len(clients) == 2 and clients[0] == clients[1], clients
    finally:
        await kube.close()
        await runner.cleanup()
