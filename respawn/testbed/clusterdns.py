"""Cluster DNS for the testbed's real node: ``<service>.<namespace>.svc.cluster.local`` and
``<hostname>.<service>.<namespace>.svc.cluster.local`` answered from the Services' EndpointSlices.

The testbed has no kube-proxy, so a Service's name resolves to the addresses of its ready
endpoints (the pods' own addresses, which the node's bridge reaches), as a headless Service's
does; a StatefulSet pod's name under its governing Service resolves to that pod. Every other name
is NXDOMAIN: the testbed reaches no other network. Run by ``respawn local up --real-node`` as its
own process (``python -m respawn.testbed.clusterdns``) on the node's address, port 53, which the
kubelet gives pods as their name server (``clusterDNS``).

The answers are read from the API server at each query (short TTL): few clients, few queries,
and nothing to keep in step.
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Final

from dnslib import QTYPE, RCODE, RR, A, DNSRecord  # type: ignore[import-untyped]
from dnslib.server import BaseResolver, DNSServer  # type: ignore[import-untyped]

DOMAIN: Final = "svc.cluster.local"
TTL: Final = 5


@dataclass(frozen=True)
class Name:
    """A cluster name split into its parts (``hostname`` empty for a Service's own name)."""

    namespace: str
    service: str
    hostname: str = ""


def parse_name(qname: str) -> Name | None:
    """The Service (and pod hostname) a query asks for; None for a name outside the cluster's."""
    name = qname.lower().rstrip(".")
    suffix = "." + DOMAIN
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split(".")
    if len(parts) == 2 and all(parts):
        return Name(namespace=parts[1], service=parts[0])
    if len(parts) == 3 and all(parts):
        return Name(namespace=parts[2], service=parts[1], hostname=parts[0])
    return None


def addresses(slices: list[dict[str, Any]], hostname: str = "") -> list[str]:
    """The IPv4 addresses of the ready endpoints (all of them, or the one named ``hostname``)."""
    found: list[str] = []
    for item in slices:
        if item.get("addressType") != "IPv4":
            continue
        for endpoint in item.get("endpoints") or []:
            # A Service that publishes not-ready addresses has every endpoint marked ready.
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            if hostname and endpoint.get("hostname") != hostname:
                continue
            found += [a for a in endpoint.get("addresses") or [] if a not in found]
    return found


class ApiServer:
    """GETs against the API server with the testbed's admin client certificate."""

    def __init__(self, url: str, ca: str, cert: str, key: str) -> None:
        self.url = url.rstrip("/")
        self.context = ssl.create_default_context(cafile=ca)
        self.context.load_cert_chain(cert, key)

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, context=self.context, timeout=3) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body

    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        selector = urllib.parse.quote(f"kubernetes.io/service-name={service}")
        path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector={selector}"
        items: list[dict[str, Any]] = self.get(path).get("items", [])
        return items


class Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        qname = str(request.q.qname)
        name = parse_name(qname)
        if name is None:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        try:
            found = addresses(self.api.endpoint_slices(name.namespace, name.service), name.hostname)
        except (OSError, ValueError):
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if not found:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in found:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=TTL))
        # Other types (AAAA): the name exists, with no record of that type.
        return reply


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m respawn.testbed.clusterdns", description=__doc__)
    parser.add_argument("--address", required=True, help="the address to answer on (the node's)")
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    resolver = Resolver(ApiServer(args.api_url, args.ca, args.cert, args.key))
    servers = [DNSServer(resolver, address=args.address, port=args.port, tcp=tcp) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    print(f"cluster DNS answering on {args.address}:{args.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    for server in servers:
        server.stop()


if __name__ == "__main__":
    main()
