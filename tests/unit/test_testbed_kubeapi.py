"""How a ``kubectl get`` becomes an API request (respawn/testbed/kubeapi.py), without a server."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

import pytest

from respawn.testbed import kubeapi, pki
from respawn.testbed.errors import TestbedError
from respawn.testbed.kubeapi import RESOURCES, parse_get


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("appwrapper", "a", "-n", "ns"), "/apis/workload.codeflare.dev/v1beta2/namespaces/ns/appwrappers/a"),
        (("aw", "a", "--namespace=ns"), "/apis/workload.codeflare.dev/v1beta2/namespaces/ns/appwrappers/a"),
        (("pods", "-n", "ns", "-l", "a=b,c"), "/api/v1/namespaces/ns/pods?labelSelector=a%3Db%2Cc"),
        (
            ("events", "-n", "ns", "--field-selector", "involvedObject.name=x"),
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3Dx",
        ),
        (("pod", "p"), "/api/v1/namespaces/default/pods/p"),
        (("appwrappers", "-A"), "/apis/workload.codeflare.dev/v1beta2/appwrappers"),
        (("node", "n1", "-n", "ignored"), "/api/v1/nodes/n1"),
        (("nodes",), "/api/v1/nodes"),
        (("jobs", "-n", "ns"), "/apis/batch/v1/namespaces/ns/jobs"),
        (("deploy", "d", "-n", "ns"), "/apis/apps/v1/namespaces/ns/deployments/d"),
        (("sts", "s", "-n", "ns"), "/apis/apps/v1/namespaces/ns/statefulsets/s"),
        (("workloads.kueue.x-k8s.io", "-n", "ns"), "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads"),
    ],
)
def test_a_get_of_a_known_kind_becomes_the_request_kubectl_would_make(
    args: tuple[str, ...], path: str
) -> None:
    query = parse_get(args)
    assert query is not None
    assert query.path() == path


@pytest.mark.parametrize(
    "args",
    [
        ("crd", "appwrappers.workload.codeflare.dev"),  # a kind not in the table
        ("pytorchjobs", "-n", "ns"),
        ("pod/p", "-n", "ns"),  # kind/name
        ("pod", "a", "b"),  # several names
        ("pod", "a", "-l", "x=y"),  # a name with a selector: kubectl's own error
        ("pod", "a", "-A"),
        ("pods", "-n"),  # a flag without its value
        ("pods", "--show-labels"),  # a flag it does not know
        (),
    ],
)
def test_what_it_does_not_know_is_left_to_kubectl(args: tuple[str, ...]) -> None:
    assert parse_get(args) is None


def test_every_name_of_a_kind_reads_the_same_resource() -> None:
    assert RESOURCES["po"] == RESOURCES["pod"] == RESOURCES["pods"]
    assert RESOURCES["aw"].plural == "appwrappers" and RESOURCES["aw"].namespaced
    assert not RESOURCES["ns"].namespaced


def _kubeconfig(tmp_path: Path, user: str, cluster_extra: str = "", context_extra: str = "") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
{cluster_extra}users:
- name: u
  user:
{user}contexts:
- name: x
  context:
    cluster: c
    user: u
{context_extra}current-context: x
"""
    )
    return path


def test_a_kubeconfig_with_a_token_is_read_here_with_the_token(tmp_path: Path) -> None:
    client = kubeapi._client_of(_kubeconfig(tmp_path, "    token: abc\n"))
    assert client is not None
    assert (client.host, client.port) == ("127.0.0.1", 6443)
    assert client.headers["Authorization"] == "Bearer abc"


@pytest.mark.parametrize(
    ("user", "cluster_extra", "context_extra"),
    [
        ("    exec:\n      command: get-token\n      apiVersion: client.authentication.k8s.io/v1\n", "", ""),
        ("    token: abc\n", "    proxy-url: http://proxy:3128\n", ""),
        ("    token: abc\n", "", "    namespace: mine\n"),
    ],
    ids=["exec-plugin", "proxy", "context-namespace"],
)
def test_a_kubeconfig_only_kubectl_understands_is_left_to_kubectl(
    tmp_path: Path, user: str, cluster_extra: str, context_extra: str
) -> None:
    assert kubeapi._client_of(_kubeconfig(tmp_path, user, cluster_extra, context_extra)) is None


def test_a_list_is_given_as_kubectl_prints_it_without_managed_fields() -> None:
    query = parse_get(("pods", "-n", "ns"))
    assert query is not None
    body = {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "7"},
        "items": [{"metadata": {"name": "p", "managedFields": [{"manager": "kubelet"}]}}],
    }
    assert kubeapi._as_kubectl_prints(query, body) == {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}],
    }


def test_embedded_certificates_are_loaded_and_leave_no_file_behind(tmp_path: Path) -> None:
    made = pki.generate(tmp_path / "pki", clients={"admin": ("admin", ("system:masters",))})
    crt, key = made.client("admin")

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    before = set(Path(tempfile.gettempdir()).glob("respawn-kubeconfig-*"))
    user = f"    client-certificate-data: {data(crt)}\n    client-key-data: {data(key)}\n"
    client = kubeapi._client_of(_kubeconfig(tmp_path, user))
    assert client is not None
    assert set(Path(tempfile.gettempdir()).glob("respawn-kubeconfig-*")) == before
    broken = f"    client-certificate-data: {data(crt)}\n    client-key-data: {data(crt)}\n"
    assert kubeapi._client_of(_kubeconfig(tmp_path, broken)) is None, "kubectl says what is wrong"


def test_a_rewritten_kubeconfig_gets_a_new_client(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, "    token: one\n")
    first = kubeapi._client(path)
    assert first is not None and kubeapi._client(path) is first
    path.write_text(path.read_text().replace("token: one", "token: two"))
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 1_000_000))
    second = kubeapi._client(path)
    assert second is not None and second is not first
    assert second.headers["Authorization"] == "Bearer two"


def test_an_answer_nested_deeper_than_the_default_decoder_goes_is_still_read() -> None:
    depth = 5_000  # the API server takes objects this deep; json.loads stops near 1,000
    deep = '{"a":' * depth + "1" + "}" * depth
    answer = '{"kind":"List","items":[{"spec":' + deep + '},{"spec":{"b":2}}]}'
    with pytest.raises(RecursionError):
        json.loads(answer)
    items = kubeapi.loads(answer)["items"]
    assert items[1] == {"spec": {"b": 2}}, "the other objects of the list are read as they are"
    level, levels = items[0]["spec"], 0
    while isinstance(level, dict):
        level, levels = level["a"], levels + 1
    assert (levels, level) == (depth, 1)
    assert kubeapi.loads(b'{"kind": "Pod"}') == {"kind": "Pod"}


def test_an_answer_too_deep_even_for_the_services_decoder_is_a_testbed_error() -> None:
    depth = 20_000  # past the deepest the services decode at all (the API server refuses it too)
    with pytest.raises(TestbedError, match="nested too deeply"):
        kubeapi.loads("[" * depth + "]" * depth)
