"""The CPU image of ``docker/Dockerfile``, built with podman and running the GRPO smoke config (2 steps).

The base image is ``localhost/debian-min:bookworm`` (made by ``tools/podman_base_image.py``: no registry serves
base images here). The build reuses the host's uv cache and CPU torch folder through RUN-step volumes, so with a
warm cache nothing big is downloaded. The image, its intermediate images and the container are removed at the end,
pass or fail; the base image is kept (creating it again costs a minute).

Needs root, podman, runc and debootstrap (installed on the fly with apt-get when missing): if they cannot be had
the test fails with the reason. It skips, saying so, only where the disk has less than 13 GB free for the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.functional.supervised_runs import REPO, assert_checkpoint, read_metrics
from tools.podman_base_image import BASE_IMAGE, PODMAN_ULIMITS, PrerequisiteError, ensure, podman

# On the worker of the other "system" tests, one at a time (tests/machine_share.py); ~11 GB of disk for the build.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400), pytest.mark.xdist_group("system")]

BUILD_TIMEOUT_S = 1800  # cold uv cache: ~5 GB of wheels to download
RUN_TIMEOUT_S = 600
# The build's disk peak: podman keeps the build container (~ the image, 5.1 GB) next to the committed layers (the
# same again) until the end, plus a temporary tar of the layer being committed in /var/tmp (up to 1.5 GB). Measured
# 10.5-11.2 GB; asking for 13 GB free fails clearly instead of filling a CI disk.
NEEDED_FREE_GB = 13


def host_uv_cache() -> Path:
    """The host's uv cache, mounted into the build so the wheels already there are not downloaded again."""
    if os.environ.get("UV_CACHE_DIR"):
        return Path(os.environ["UV_CACHE_DIR"])
    uv = shutil.which("uv")
    if uv:
        proc = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return Path(proc.stdout.strip())
    return Path.home() / ".cache" / "uv"


def build_args(tag: str) -> list[str]:
    cache = host_uv_cache()
    cache.mkdir(parents=True, exist_ok=True)
    args = [
        "build",
        "--network=host",
        *PODMAN_ULIMITS,
        "--build-arg",
        f"BASE_IMAGE={BASE_IMAGE}",
        "--build-arg",
        "TARGET=cpu",
        "--build-arg",
        "UV_CACHE_DIR=/uv-cache",
        "--volume",
        f"{cache}:/uv-cache",
    ]
    if Path("/opt/wheels").is_dir():
        args += ["--volume", "/opt/wheels:/opt/wheels:ro"]
    ca_bundle = os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    if Path(ca_bundle).is_file():  # a TLS-intercepting proxy's CA (this machine kind has one) reaches the build
        args += ["--volume", f"{ca_bundle}:/mnt/host-ca.crt:ro", "--build-arg", "SSL_CERT_FILE=/mnt/host-ca.crt"]
    return [*podman(*args), "-f", str(REPO / "docker" / "Dockerfile"), "-t", tag, str(REPO)]


def new_image_ids(build_output: str) -> list[str]:
    """The images a build committed (its `--> ID` lines), newest first; steps taken from the layer cache
    (`--> Using cache ID`) belong to an earlier build and are left alone."""
    ids = re.findall(r"^--> ([0-9a-f]{11,64})$", build_output, flags=re.MULTILINE)
    return ids[::-1]


def remove_build(tag: str, build_output: str, container: str) -> None:
    """The container, the image and the intermediate images this build committed; nothing else. (Layers shared
    with other images stay: podman counts their users.)"""
    subprocess.run(podman("rm", "--force", "--ignore", container), capture_output=True)
    subprocess.run(podman("rmi", "--ignore", tag), capture_output=True)
    image_ids = new_image_ids(build_output)
    if image_ids:
        subprocess.run(podman("rmi", "--ignore", *image_ids), capture_output=True)


def test_cpu_image_runs_grpo_smoke(tmp_path):
    try:
        ensure(quiet=True)
    except PrerequisiteError as exc:
        pytest.fail(f"container prerequisites unavailable (python tools/podman_base_image.py): {exc}")

    storage = Path("/var/lib/containers")
    free_gb = shutil.disk_usage(storage if storage.exists() else "/var").free / 2**30
    if free_gb < NEEDED_FREE_GB:  # like a missing GPU: a property of the machine, said in the skip reason
        pytest.skip(f"{free_gb:.1f} GB free where podman stores images; building the image needs {NEEDED_FREE_GB} GB")

    build_id = uuid.uuid4().hex[:12]
    tag = f"localhost/nemo-rl-clone-test:{build_id}"
    container = f"nemo-rl-clone-test-{build_id}"
    out = tmp_path / "out"
    out.mkdir()
    build_output = ""
    try:
        start = time.monotonic()
        try:
            proc = subprocess.run(
                build_args(tag), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout or ""
            build_output = output.decode(errors="replace") if isinstance(output, bytes) else output
            raise
        build_output = proc.stdout
        assert proc.returncode == 0, f"podman build failed:\n{build_output[-6000:]}"
        print(f"image built in {time.monotonic() - start:.0f} s")

        start = time.monotonic()
        run = podman(
            "run",
            "--rm",
            "--name",
            container,
            *PODMAN_ULIMITS,
            # Ray's object store wants /dev/shm of 30% of the RAM (64 MB by default in a container; with less it falls
            # back to files in the log dir, slower). tmpfs costs only what is used.
            "--shm-size=8g",
            "--volume",
            f"{out}:/out",
            tag,
            "examples/run_grpo_math.py",
            "--config",
            "configs/grpo_smoke.yaml",
            "grpo.max_num_steps=2",
            "logger.log_dir=/out/logs",
            "checkpointing.checkpoint_dir=/out/ckpt",
        )
        proc = subprocess.run(run, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, f"the smoke run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        print(f"smoke run in the container: {time.monotonic() - start:.0f} s")
    finally:
        remove_build(tag, build_output, container)

    (run_dir,) = (out / "logs").iterdir()
    metrics = read_metrics(run_dir)
    assert sorted(metrics) == [1, 2], sorted(metrics)
    for step in (1, 2):
        assert "train/loss" in metrics[step] and "train/reward" in metrics[step], metrics[step]
    assert "validation/accuracy" in metrics[2], metrics[2]
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step_1", "step_2"]
    assert_checkpoint(out / "ckpt" / "step_2")
    assert subprocess.run(podman("image", "exists", tag)).returncode != 0, f"{tag} was not removed"
