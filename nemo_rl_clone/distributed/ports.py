"""Free TCP ports: for rendezvous (`RayVirtualCluster.get_master_address_and_port`), engines (``VLLM_PORT``) and
the pre-flight check of a fixed Ray port."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Collection

_OS_PORT_ATTEMPTS = 20


def pick_free_port(low: int | None = None, high: int | None = None, excluded: Collection[int] = ()) -> int:
    """A TCP port free on this machine right now and not in ``excluded``: any (the OS picks) or, given
    ``low``/``high``, one in ``[low, high]`` tried in random order (so that groups starting together rarely try the
    same one first).

    Raises:
        RuntimeError: no such port is free.
    """
    if low is None or high is None:
        candidates = [0] * _OS_PORT_ATTEMPTS  # binding port 0 lets the OS pick a free one
    else:
        # SystemRandom: workers seeded alike (the run's seed) must not all try the same order.
        candidates = [
            p for p in random.SystemRandom().sample(range(low, high + 1), high - low + 1) if p not in excluded
        ]
    for candidate in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", candidate))
            except OSError:
                continue
            port = sock.getsockname()[1]
            if port not in excluded:
                return port
    where = "from the OS" if low is None or high is None else f"in {low}..{high}"
    raise RuntimeError(f"no free TCP port {where} on {socket.gethostname()} besides {len(excluded)} already taken")


def port_was_taken(error: BaseException) -> bool:
    """Whether a process failed because its rendezvous port was in use (torch's DistNetworkError, EADDRINUSE)."""
    return "EADDRINUSE" in str(error)


def check_ray_port_free() -> str | None:
    """One line if ``RAY_GCS_SERVER_PORT`` (the port Ray's head binds when it starts here) is taken or invalid."""
    value = os.environ.get("RAY_GCS_SERVER_PORT")
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        return f"RAY_GCS_SERVER_PORT={value!r}: not a port number"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", int(value)))
        except OSError as error:
            return f"RAY_GCS_SERVER_PORT={value}: the port is already in use on this machine ({error.strerror})"
    return None
