"""A run's connection to the cluster: the client, every kind it touches resolved once, and the
namespace its AppWrappers live in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workload import namespace_manifest
from shared.appwrapper.constants import API_VERSION, KIND
from shared.kube import Kube, ResourceRef

# What the benchmark watches, lists and writes, by a short key.
KINDS = {
    "aw": (API_VERSION, KIND),
    "pod": ("v1", "Pod"),
    "node": ("v1", "Node"),
    "job": ("batch/v1", "Job"),
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
}
# The kinds an AppWrapper of the workload wraps.
COMPONENTS = ("job", "pytorchjob")


@dataclass
class Session:
    kube: Kube
    kubeconfig: Path
    namespace: str
    refs: dict[str, ResourceRef]

    @classmethod
    async def open(cls, kube: Kube, kubeconfig: Path, namespace: str) -> Session:
        refs = {key: await kube.resource(api_version, kind) for key, (api_version, kind) in KINDS.items()}
        return cls(kube, kubeconfig, namespace, refs)

    @classmethod
    async def connect(cls, kubeconfig: Path, namespace: str) -> Session:
        """A new client (closed with ``close``) and the kinds resolved."""
        kube = await Kube.connect(kubeconfig)
        try:
            return await cls.open(kube, kubeconfig, namespace)
        except BaseException:
            await kube.close()
            raise

    async def close(self) -> None:
        await self.kube.close()

    async def create_namespace(self) -> None:
        await self.kube.create(
            await self.kube.resource("v1", "Namespace"), namespace_manifest(self.namespace)
        )

    async def listing(self, key: str) -> list[dict[str, Any]]:
        """A fresh LIST of one kind in the namespace (not what the watches say)."""
        items: list[dict[str, Any]] = (await self.kube.list(self.refs[key], self.namespace)).get("items", [])
        return items
