"""The one Kubernetes client layer (kubernetes_asyncio underneath): see client.py and watch.py."""

from shared.kube.client import Kube, KubeApiError, ResourceRef

__all__ = ["Kube", "KubeApiError", "ResourceRef"]
