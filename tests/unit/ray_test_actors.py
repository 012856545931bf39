"""Small actor classes for the Ray layer tests.

Ray workers import them as ``tests.unit.ray_test_actors``: workers start in the driver's working directory and
the editable install puts the repo root on ``sys.path``, where ``tests`` is a namespace package.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

MODULE = "tests.unit.ray_test_actors"


class RankEchoActor:
    """Reports what the worker group gave it."""

    def __init__(self, tag: str = "", marker_dir: str | None = None) -> None:
        self.tag = tag
        self.marker_dir = marker_dir
        self.rank = int(os.environ["RANK"])

    def echo(self, data: Any, scale: int = 1) -> tuple[int, Any]:
        return self.rank, data if scale == 1 else [x * scale for x in data]

    def count_up(self, n: int) -> Iterator[tuple[int, int]]:
        """A generator method: Ray streams its items (the call returns an ``ObjectRefGenerator``)."""
        for i in range(n):
            yield self.rank, i

    def get_env(self, keys: list[str]) -> dict[str, str | None]:
        return {key: os.environ.get(key) for key in keys}

    def get_tag(self) -> str:
        return self.tag

    def get_node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def get_python(self) -> tuple[str, str]:
        return sys.executable, sys.prefix

    def fail_on_rank(self, failing_rank: int) -> int:
        """The failing rank raises at once; the others block, as ranks stuck in a collective would."""
        if self.rank == failing_rank:
            raise ValueError(f"rank {self.rank} failed on purpose")
        time.sleep(3600)
        return self.rank

    def cleanup(self) -> None:
        """Leaves a file behind so tests can see it ran before the actor was killed."""
        assert self.marker_dir is not None, "construct with marker_dir to test cleanup"
        Path(self.marker_dir, f"cleanup-{self.rank}").write_text(self.tag)


class VenvProbeActor(RankEchoActor):
    """A separate class name so registering its environment affects no other test."""


class FailingInitActor:
    def __init__(self) -> None:
        if os.environ["RANK"] == "1":
            raise RuntimeError("constructor of rank 1 failed on purpose")


class PortTakenOnceActor:
    """Joins a gloo process group on the group's rendezvous port; on the first start another socket takes that port
    before rank 0 listens (what a process beside the run can do between the port probe and the listen)."""

    def __init__(self, marker_dir: str) -> None:
        import socket

        import torch.distributed as dist

        marker = Path(marker_dir, "taken")
        if os.environ["RANK"] == "0" and not marker.exists():
            marker.write_text(os.environ["MASTER_PORT"])
            self.squatter = socket.create_server(("", int(os.environ["MASTER_PORT"])))
        dist.init_process_group("gloo")

    def world_size(self) -> int:
        import torch.distributed as dist

        return dist.get_world_size()


class DataPlaneReader:
    """The data-plane side of a policy worker (`TQWorkerMixin`) around a stand-in computation: its "logprobs" are
    the rows' token ids times two, so a test can tell whose rows were read and written."""

    def __init__(self, rank: int) -> None:
        from nemo_rl_clone.data_plane.worker_mixin import TQWorkerMixin

        class Worker(TQWorkerMixin):
            def get_logprobs(self, data: Any, micro_batch_size: int | None = None) -> dict[str, Any]:
                return {"logprobs": data["input_ids"].float() * 2}

        self.worker = Worker()
        self.worker.rank = rank

    def setup_data_plane(self, cfg: dict[str, Any]) -> None:
        self.worker.setup_data_plane(cfg)

    def logprobs(self, meta: Any) -> None:
        self.worker.get_logprobs_presharded(meta)

    def fetch(self, meta: Any) -> dict[str, Any]:
        data = self.worker._fetch(meta)
        return {"columns": dict(data), "plan": data.microbatch_plan}
