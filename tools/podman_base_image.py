"""Make podman usable on a Debian machine with no container registry: install podman/runc/debootstrap and build the
base image ``localhost/debian-min:bookworm`` from Debian's own mirror. Idempotent; the second run takes a second.

    python tools/podman_base_image.py            # install what is missing, create the base image if missing
    python tools/podman_base_image.py --check    # only report; exit 1 if something is missing

docker/Dockerfile then builds on it with ``--build-arg BASE_IMAGE=localhost/debian-min:bookworm``. On sandboxed
machines (ours) podman also needs the global options of `PODMAN_GLOBAL_OPTIONS` and the limits of `PODMAN_ULIMITS`
on ``build`` and ``run``: crun refuses hybrid cgroups, and the default open-file/process limits exceed what the
sandbox allows. Both are harmless on ordinary hosts. docs/cluster.md has the whole story.

Needs root (apt-get, debootstrap, rootful podman). Debian bookworm's python3 is 3.11, the project's version.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

BASE_IMAGE = "localhost/debian-min:bookworm"
PACKAGES = ("podman", "runc", "debootstrap")
PODMAN_GLOBAL_OPTIONS = ("--runtime", "runc", "--cgroup-manager=cgroupfs")
PODMAN_ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")


class PrerequisiteError(RuntimeError):
    """Podman or the base image cannot be had on this machine; the message says why and what to do."""


def podman(*args: str) -> list[str]:
    """A podman command line with the global options this machine kind needs."""
    return ["podman", *PODMAN_GLOBAL_OPTIONS, *args]


def missing_packages() -> list[str]:
    return [name for name in PACKAGES if shutil.which(name) is None and shutil.which(name, path="/usr/sbin") is None]


def install_packages(names: list[str]) -> None:
    if shutil.which("apt-get") is None:
        raise PrerequisiteError(
            f"{', '.join(names)} missing and no apt-get here: install them with your package manager"
        )
    if os.geteuid() != 0:
        raise PrerequisiteError(
            f"{', '.join(names)} missing: run as root, or `sudo apt-get install -y {' '.join(names)}`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *names]
    if subprocess.run(install, env=env, capture_output=True, text=True).returncode != 0:
        # A stale package index is the usual cause; refresh it once.
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PrerequisiteError(f"`{' '.join(install)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def image_exists(name: str) -> bool:
    return subprocess.run(podman("image", "exists", name), capture_output=True).returncode == 0


def create_base_image(name: str, suite: str, mirror: str | None) -> None:
    """debootstrap a minimal Debian into a temporary folder, import it as ``name``, delete the folder."""
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    with tempfile.TemporaryDirectory(prefix="debian-min-", dir="/var/tmp") as tmp:
        root = os.path.join(tmp, "rootfs")
        cmd = [debootstrap, "--variant=minbase", suite, root, *([mirror] if mirror else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PrerequisiteError(f"`{' '.join(cmd)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(podman("import", "-", name), stdin=tar.stdout, capture_output=True, text=True)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            raise PrerequisiteError(f"importing the debootstrap tree as {name} failed:\n{imp.stderr[-2000:]}")


def ensure(name: str = BASE_IMAGE, suite: str = "bookworm", mirror: str | None = None, quiet: bool = False) -> None:
    """Install what is missing and create the base image if it does not exist. Raises `PrerequisiteError`."""
    say = (lambda _msg: None) if quiet else (lambda msg: print(msg, flush=True))
    missing = missing_packages()
    if missing:
        say(f"installing {' '.join(missing)} ...")
        install_packages(missing)
    if image_exists(name):
        say(f"{name}: present")
        return
    say(f"{name}: creating it with debootstrap ({suite}, minbase; about a minute and 200 MB) ...")
    start = time.monotonic()
    create_base_image(name, suite, mirror)
    say(f"{name}: created in {time.monotonic() - start:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=BASE_IMAGE, help=f"name of the base image (default {BASE_IMAGE})")
    parser.add_argument("--suite", default="bookworm", help="Debian suite to debootstrap (default bookworm)")
    parser.add_argument("--mirror", default=None, help="Debian mirror URL (default: debootstrap's)")
    parser.add_argument("--check", action="store_true", help="only report what is missing; exit 1 if anything is")
    args = parser.parse_args()
    if args.check:
        missing = missing_packages()
        has_image = not missing and image_exists(args.image)
        print(f"missing packages: {' '.join(missing) or 'none'}; {args.image}: {'present' if has_image else 'missing'}")
        return 0 if has_image else 1
    try:
        ensure(args.image, args.suite, args.mirror)
    except PrerequisiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"podman global options for this machine kind: {' '.join(PODMAN_GLOBAL_OPTIONS)}")
    print(f"limits for `podman build` and `podman run`: {' '.join(PODMAN_ULIMITS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
