"""Shared fixtures.

`ray_local`: a local Ray cluster for a test module. Ray starts once per session (5-10 s here) and is reused by every
module that asks for it; a module that needs a different cluster (tests/unit/test_multinode_cluster.py) shuts it
down and the next `ray_local` user starts it again. ``RAY_ADDRESS`` in the environment makes the tests attach to that
cluster instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# Logical CPUs of the test cluster: actors in tests idle most of the time, so a 2-core machine can host 8 slots.
RAY_TEST_NUM_CPUS = 8


@pytest.fixture(scope="session")
def _ray_session_shutdown() -> Iterator[None]:
    yield
    import ray

    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_ray_session_shutdown: None) -> None:
    """Ensures this process is connected to Ray (starting a local cluster of 8 logical CPUs if needed)."""
    from nemo_rl_clone.distributed.virtual_cluster import init_ray

    init_ray(num_cpus=RAY_TEST_NUM_CPUS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` skip with a reason where CUDA is absent (every CPU machine, CI included)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine (CI never has one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
