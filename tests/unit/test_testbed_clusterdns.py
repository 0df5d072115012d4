"""The testbed's cluster DNS: which names it answers and with which addresses."""

from __future__ import annotations

from typing import Any

import pytest

from respawn.testbed import clusterdns
from respawn.testbed.clusterdns import Name


@pytest.mark.parametrize(
    ("qname", "name"),
    [
        ("respawn-nats.respawn-system.svc.cluster.local.", Name("respawn-system", "respawn-nats")),
        ("RESPAWN-NATS.Respawn-System.svc.cluster.local", Name("respawn-system", "respawn-nats")),
        (
            "respawn-nats-0.respawn-nats-headless.respawn-system.svc.cluster.local.",
            Name("respawn-system", "respawn-nats-headless", "respawn-nats-0"),
        ),
        ("example.com.", None),
        ("respawn-nats.", None),
        ("svc.cluster.local.", None),
        ("a.b.c.d.svc.cluster.local.", None),
        ("..svc.cluster.local.", None),
    ],
)
def test_names_are_read_as_service_namespace_and_pod_hostname(qname: str, name: Name | None) -> None:
    assert clusterdns.parse_name(qname) == name


def endpoint(address: str, *, ready: bool | None = True, hostname: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"addresses": [address], "conditions": {} if ready is None else {"ready": ready}}
    if hostname:
        found["hostname"] = hostname
    return found


SLICES = [
    {
        "addressType": "IPv4",
        "endpoints": [
            endpoint("10.88.1.10", hostname="respawn-nats-0"),
            endpoint("10.88.1.11", hostname="respawn-nats-1"),
            endpoint("10.88.1.12", ready=False, hostname="respawn-nats-2"),
            endpoint("10.88.1.13", ready=None),
        ],
    },
    {"addressType": "IPv6", "endpoints": [endpoint("fd00::1")]},
]


def test_a_service_resolves_to_its_ready_ipv4_endpoints() -> None:
    assert clusterdns.addresses(SLICES) == ["10.88.1.10", "10.88.1.11", "10.88.1.13"]


def test_a_pod_hostname_resolves_to_its_own_endpoint_only() -> None:
    assert clusterdns.addresses(SLICES, "respawn-nats-1") == ["10.88.1.11"]
    # Not ready (and not published while not ready): no answer.
    assert clusterdns.addresses(SLICES, "respawn-nats-2") == []
    assert clusterdns.addresses([], "respawn-nats-0") == []
