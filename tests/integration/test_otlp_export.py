"""A service configured by the standard OTEL_* variables really exports to an OTLP receiver, and
with RESPAWN_LOG_FORMAT=json really logs JSON lines.

The receivers are the collector's two protocols, written here from the OTLP protobuf schema
(opentelemetry-proto): a gRPC TraceService on grpcio, and an HTTP endpoint taking
``POST /v1/traces`` (http/protobuf). A watcher process exports to one of them while an
AppWrapper is submitted; its publication's producer span must arrive with the service name, the
resource attributes and the messaging attributes of the semantic conventions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from respawn.testbed import manifests
from respawn.testbed.modes import Endpoints
from tests.integration.conftest import services_on
from tests.integration.objects import apply
from tests.waiting import until

pytestmark = pytest.mark.testbed


class Received:
    """Spans as the receiver got them: (resource attributes, span name, span attributes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[dict[str, Any], str, dict[str, Any]]] = []

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append((resource, span.name, attributes(span.attributes)))

    def snapshot(self) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
        with self.lock:
            return list(self.spans)


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    items: list[KeyValue] = list(kvs)
    return {kv.key: value(kv.value) for kv in items}


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(
            self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
        ) -> trace_service_pb2.ExportTraceServiceResponse:
            received.take(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.take(request)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def published(received: Received, namespace: str) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """The producer spans of the watcher's publications about ``namespace``'s AppWrapper."""
    return [
        span
        for span in received.snapshot()
        if span[1] == "send observation.appwrapper"
        and f".aw.{namespace}." in str(span[2].get("messaging.destination.name", ""))
    ]


async def export_through(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    tmp_path: Path,
    endpoint: str,
    protocol: str,
    received: Received,
) -> None:
    """Run a watcher exporting to ``endpoint`` by ``protocol`` while an AppWrapper is submitted;
    check what arrives."""
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "respawn-watcher-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=itest",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "RESPAWN_LOG_FORMAT": "json",
    }
    logs = tmp_path / "logs"
    with services_on(testbed.kubeconfig, testbed.nats_url, logs) as start:
        start("watcher", env=env)
        apply(testbed.kubeconfig, namespace, manifests.job_appwrapper("exported"))
        spans = await until(
            "the watcher's publication span at the receiver",
            lambda: published(received, namespace),
            within=30,
        )
    resource, _, span = spans[0]
    assert resource["service.name"] == "respawn-watcher-under-test"
    assert resource["deployment.environment"] == "itest"
    assert span["messaging.system"] == "nats"
    assert span["messaging.operation.type"] == "send"
    assert span["messaging.destination.name"].startswith(f"respawn.obs.v1.aw.{namespace}.exported")
    assert span["messaging.message.id"]
    assert span["messaging.message.body.size"] > 0

    # Every line the running service wrote is one JSON object with the documented fields.
    lines = (logs / "watcher.log").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert records, "the watcher logged nothing"
    for record in records:
        assert {"timestamp", "level", "logger", "message", "service"} <= record.keys()
        assert record["service"] == "watcher"
    assert any(r["message"].startswith("telemetry ready: trace export otlp_proto_") for r in records)


async def test_spans_reach_an_otlp_grpc_receiver(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    tmp_path: Path,
    grpc_receiver: tuple[str, Received],
) -> None:
    endpoint, received = grpc_receiver
    await export_through(testbed, appwrapper_crd, namespace, tmp_path, endpoint, "grpc", received)


async def test_spans_reach_an_otlp_http_protobuf_receiver(
    testbed: Endpoints,
    appwrapper_crd: Path,
    namespace: str,
    tmp_path: Path,
    http_receiver: tuple[str, Received],
) -> None:
    endpoint, received = http_receiver
    await export_through(testbed, appwrapper_crd, namespace, tmp_path, endpoint, "http/protobuf", received)
