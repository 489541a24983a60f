"""The sidecar image, built as CI and a release build it (scripts/image/build.sh: a base from Debian's packages by
mmdebstrap, pinned wheels, buildah with chroot isolation) and run as the chart runs it: as its configured non-root
user, on a read-only root file system, serving `demo` on loopback, scraped. Its size is held to SIZE_LIMIT, and a
plain `buildah bud .` (the Containerfile's default base, here replaced by the local one: no registry is reachable)
builds an image that serves too.

No container runtime works on these machines, so the test runs the image's root file system the way a runtime
would for this image: the image's own entrypoint, user, environment and working directory (read from its config),
in a private mount namespace where the root is mounted read-only."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, require_binary
from support.loopback import free_port, scrape_until

from exporter import __version__

IMAGE = f"localhost/posttrain-exporter-test:{__version__}"
PLAIN = "localhost/posttrain-exporter-plain-bud:test"
ENV = {**os.environ, "STORAGE_DRIVER": "vfs"}
# A training node pulls the sidecar beside a trainer image: a third of what it was with the kubernetes client
# (431 MB). Uncompressed, as `buildah images` shows it (MB: 10^6 bytes); bench/README.md has the breakdown.
SIZE_LIMIT = 150_000_000
pytestmark = pytest.mark.slow


def _buildah(*args: str, timeout: float = 120) -> str:
    r = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, env=ENV)
    assert r.returncode == 0, f"buildah {' '.join(args)}: {r.stderr[-2000:]}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image() -> Iterator[dict]:
    yield from _built(None)


def _built(plain: Path | None) -> Iterator[dict]:
    """The image of build.sh, or (`plain`: a Containerfile) of a plain `buildah bud` once build.sh made the base and
    the wheels; its config and its root file system mounted."""
    for tool in ("buildah", "mmdebstrap", "unshare", "chroot"):
        require_binary(tool)
    if os.geteuid() != 0:
        pytest.skip("running the image's root file system needs root (CI runs as root)")
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    if plain is None:
        name = IMAGE
        r = subprocess.run([str(REPO / "scripts" / "image" / "build.sh"), IMAGE], capture_output=True, text=True,
                           timeout=900, env=ENV, cwd=REPO)
        assert r.returncode == 0, r.stderr[-4000:]
        assert r.stdout.strip().splitlines()[-1] == IMAGE
    else:  # no --build-arg: every ARG at its default
        name = PLAIN
        r = subprocess.run(["buildah", "bud", "--isolation", "chroot", "--layers=false", "-f", str(plain), "-t", name,
                            "."], capture_output=True, text=True, timeout=900, env=ENV, cwd=REPO)
        assert r.returncode == 0, r.stderr[-4000:]
    inspected = json.loads(_buildah("inspect", "--type", "image", name))
    ctr = _buildah("from", name)
    try:
        yield {"config": inspected["OCIv1"]["config"], "root": _buildah("mount", ctr), "revision": head or "unknown",
               "manifest": json.loads(inspected["Manifest"]), "name": name}
    finally:
        _buildah("rm", ctr)
        _buildah("rmi", "--force", name)


def _as_the_image_runs(image: dict, args: list[str]) -> list[str]:
    """A command line that runs `args` (after the entrypoint, as a container's command) in the image's root file
    system mounted read-only, as the image's user, with the image's environment and nothing else."""
    cfg, root = image["config"], image["root"]
    user = cfg["User"]
    assert re.fullmatch(r"\d+:\d+", user), f"the image must name a numeric user for runAsNonRoot: {user!r}"
    mounts = (f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && mount --rbind /dev {root}/dev "
              f"&& mount -t proc proc {root}/proc && mount -t tmpfs tmpfs {root}/tmp")
    inner = ["chroot", f"--userspec={user}", root, "env", "-i", *cfg["Env"], "sh", "-c",
             f'cd {cfg.get("WorkingDir") or "/"} && exec "$@"', "sh", *cfg["Entrypoint"], *args]
    # --pid: the exporter is the namespace's first process, as in a container; --kill-child: it never outlives unshare
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child=TERM",
            "sh", "-c", f'{mounts} && exec "$@"', "sh", *inner]


def test_image_config_is_what_the_chart_expects(image: dict) -> None:
    cfg = image["config"]
    assert cfg["User"] == "10001:10001"  # the chart's runAsUser/runAsGroup
    assert cfg["Entrypoint"] == ["posttrain-exporter"]
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == image["revision"]  # the commit it was built from
    assert "9847/tcp" in cfg["ExposedPorts"]


def test_image_runs_as_non_root_on_a_read_only_root(image: dict) -> None:
    probe = _as_the_image_runs(image, ["--version"])
    r = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"posttrain-exporter {__version__}"
    # the same mounts and user, a shell instead of the entrypoint: who we are and whether / can be written
    shell = [a if a != "posttrain-exporter" else "sh" for a in _as_the_image_runs(image, [])]
    r = subprocess.run([*shell, "-c", "id -u; touch /probe"], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == [image["config"]["User"].split(":")[0]]
    assert "Read-only file system" in r.stderr


def test_image_serves_demo_and_is_scraped(image: dict, tmp_path) -> None:
    _serves_demo(image, tmp_path)


def _serves_demo(image: dict, tmp_path) -> None:
    port = free_port()
    err = (tmp_path / "stderr").open("wb")
    proc = subprocess.Popen(_as_the_image_runs(image, ["demo", "--web.listen-address", f"127.0.0.1:{port}"]),
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        body = scrape_until(port, lambda b: re.search(r"^posttrain_step\{[^}]*\} [1-9]", b, re.M) is not None,
                            proc, timeout=60)
        assert re.search(r"^posttrain_step\{[^}]*\} [1-9]", body, re.M), body[-2000:]
        assert f'version="{__version__}"' in body
        assert re.search(r"^posttrain_reward_std\{", body, re.M)
    finally:
        # stopped as a runtime stops a container: SIGTERM to its first process (unshare itself ignores it while it
        # waits for its child, and hands on the child's exit status)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        for pid in (children.read_text().split() if children.exists() else []):
            os.kill(int(pid), signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err.close()
    assert proc.returncode == 0, f"exit {proc.returncode}: " + (tmp_path / "stderr").read_text()[-2000:]
    # the exporter inside ended with unshare: nothing of the image is left running
    pattern = f"posttrain-exporter demo --web.listen-address 127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while (left := subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == "", f"the image's exporter outlived its container: {left}"


def test_image_is_at_most_150_mb_and_holds_no_build_tools(image: dict) -> None:
    size = sum(layer["size"] for layer in image["manifest"]["layers"])  # the layers as stored: uncompressed tars
    assert size <= SIZE_LIMIT, f"the image is {size / 1e6:.1f} MB, over {SIZE_LIMIT / 1e6:.0f} MB"
    root = Path(image["root"])
    tools = [str(p.relative_to(root)) for p in root.glob("usr/**/*-packages/*")
             if re.match(r"(pip|setuptools|wheel|_distutils_hack)(-|$)", p.name)]
    tools += [str(p.relative_to(root)) for p in root.glob("opt/posttrain-exporter/bin/*")
              if p.name.startswith(("pip", "easy_install", "wheel"))]
    tools += [str(p.relative_to(root)) for d in ("usr", "opt") for p in (root / d).rglob("*.whl")]
    assert tools == [], f"build tools left in the image: {tools}"
    site = next(root.glob("opt/posttrain-exporter/lib/python3*/site-packages"))
    assert {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")} >= {"numpy", "prometheus_client"}
    assert not (site / "kubernetes").exists() and not (site / "urllib3").exists()


def test_plain_buildah_bud_with_the_default_base_builds_an_image_that_serves(image: dict, tmp_path) -> None:
    """`buildah bud .` as a user runs it, no build arguments, with the Containerfile's default base replaced by the
    local one (where a registry can be reached the default is pulled instead); the wheels build.sh left in
    image/wheels are what it installs."""
    text = (REPO / "Containerfile").read_text()
    default = re.search(r"^ARG BASE=(\S+)$", text, re.M)
    assert default is not None and "/" in default[1], "Containerfile: ARG BASE needs a default a registry has"
    base = f"localhost/posttrain-exporter-base:bookworm-{_arch()}"  # what build.sh made for the image fixture
    plain = tmp_path / "Containerfile"
    plain.write_text(text.replace(default[0], f"ARG BASE={base}"))
    for built in _built(plain):
        cfg = built["config"]
        assert cfg["Entrypoint"] == ["posttrain-exporter"] and cfg["User"] == "10001:10001"
        _serves_demo(built, tmp_path)


def _arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()


def test_the_exporter_uses_no_numpy_part_the_image_leaves_out() -> None:
    """install_wheels.py leaves numpy's random, fft and the like out of the image: the exporter's code must name
    none of them (np.random, numpy.fft, `from numpy import random`), or the image would fail where tests pass."""
    import ast
    import sys

    sys.path.insert(0, str(REPO / "scripts" / "image"))
    try:
        from install_wheels import NUMPY_LEFT_OUT
    finally:
        sys.path.pop(0)
    used = []
    for path in (REPO / "exporter").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("np", "numpy") and node.attr in NUMPY_LEFT_OUT:
                used.append(f"{path.name}: {node.value.id}.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("numpy"):
                parts = node.module.split(".")[1:] + [a.name for a in node.names]
                used += [f"{path.name}: from {node.module}" for p in parts if p in NUMPY_LEFT_OUT]
            elif isinstance(node, ast.Import):
                used += [f"{path.name}: import {a.name}" for a in node.names
                         if a.name.split(".")[0] == "numpy" and set(a.name.split(".")[1:]) & set(NUMPY_LEFT_OUT)]
    assert used == [], used


def test_every_dependency_is_pinned_for_the_image() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pinned = {re.split(r"==", ln)[0].lower().replace("_", "-")
              for ln in (REPO / "image" / "constraints.txt").read_text().splitlines()
              if ln and not ln.startswith("#")}
    wanted = project["dependencies"]
    assert "kubernetes" not in project.get("optional-dependencies", {})  # the k8s:// source needs no client package
    names = {re.match(r"[A-Za-z0-9_.-]+", d)[0].lower().replace("_", "-") for d in wanted}
    assert names <= pinned, f"not pinned in image/constraints.txt: {sorted(names - pinned)}"
