"""`build_data_plane_client`: the client of the engine ``data_plane.impl`` names (TransferQueue is the only one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_rl_clone.data_plane.interfaces import DataPlaneClient


def build_data_plane_client(cfg: Any, *, bootstrap: bool = True) -> DataPlaneClient:
    """Connect this process to the data plane; ``bootstrap``: this process (the driver) starts the queue and stops
    it at `DataPlaneClient.close`. ``cfg``: the ``data_plane`` section, validated (`DataPlaneConfig`) or a mapping."""
    impl = cfg["impl"] if isinstance(cfg, Mapping) else cfg.impl
    if impl != "transfer_queue":
        raise ValueError(f"data_plane.impl: {impl!r} is not a data plane here; use transfer_queue")
    from nemo_rl_clone.data_plane.adapters.transfer_queue import TQDataPlaneClient

    return TQDataPlaneClient(cfg, bootstrap=bootstrap)
