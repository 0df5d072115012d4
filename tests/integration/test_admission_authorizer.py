"""The validating webhook's access checks (KubeAuthorizer) against the real API server.

Each check becomes a SubjectAccessReview for the kind's discovered resource, answered by the
API server's own RBAC; a failed request is reported as an error, never as permission.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from services.webhook.admission import AccessCheck, AccessResult, UserInfo
from services.webhook.server import KubeAuthorizer
from shared.kube import Kube
from tests.waiting import until

pytestmark = pytest.mark.testbed

USER = "alice"


@pytest.fixture
async def kube(testbed: Endpoints) -> AsyncIterator[Kube]:
    client = await Kube.connect(testbed.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


def check(api_version: str, kind: str, namespace: str, user: UserInfo | None = None) -> AccessCheck:
    return AccessCheck(api_version, kind, namespace, user or UserInfo(username=USER))


async def test_kube_authorizer_posts_a_review_for_the_discovered_resource(
    testbed: Endpoints, kube: Kube, namespace: str
) -> None:
    authorize = KubeAuthorizer(kube)
    assert await authorize(check("apps/v1", "Deployment", namespace)) == AccessResult(False)
    # A Role on the resource discovery names ("deployments") is what makes the answer yes.
    kubectl(testbed.kubeconfig, "create", "role", "make-deployments", "-n", namespace,
            "--verb=create", "--resource=deployments")  # fmt: skip
    kubectl(testbed.kubeconfig, "create", "rolebinding", "alice-deployments", "-n", namespace,
            "--role=make-deployments", f"--user={USER}")  # fmt: skip
    # The API server's authorizer learns of new RBAC objects through its own watch: a moment later.
    await until(
        "the Role to allow creating Deployments",
        lambda: authorize(check("apps/v1", "Deployment", namespace)),
        done=lambda answer: answer.allowed,
    )
    assert not (await authorize(check("batch/v1", "Job", namespace))).allowed


async def test_kube_authorizer_asks_about_every_resource_for_unserved_kinds(
    kube: Kube, namespace: str
) -> None:
    authorize = KubeAuthorizer(kube)
    widget = ("example.com/v1", "Widget", namespace)
    denied = await authorize(check(*widget))
    assert denied == AccessResult(False), "not served: only rights on every resource of the group pass"
    admin = UserInfo(username="root", groups=("system:masters",))
    assert (await authorize(check(*widget, admin))).allowed


async def test_kube_authorizer_reports_api_failures_as_errors(testbed: Endpoints, tmp_path: Path) -> None:
    config = yaml.safe_load(testbed.kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(yaml.safe_dump(config))
    client = await Kube.connect(unreachable)
    try:
        result = await KubeAuthorizer(client)(check("apps/v1", "Deployment", "default"))
    finally:
        await client.close()
    assert not result.allowed
    assert result.error
