"""The transfer-queue data plane (``data_plane.enabled``): a step's rows live in TransferQueue's storage units (Ray
actors), the driver and the policy workers exchange keys (`KVBatchMeta`), and the workers read their own rows and
write their per-token results there. `build_data_plane_client` connects a process; docs/data_plane.md says what
moves where and what it costs."""

from nemo_rl_clone.data_plane.factory import build_data_plane_client
from nemo_rl_clone.data_plane.interfaces import DataPlaneClient, KVBatchMeta

__all__ = ["DataPlaneClient", "KVBatchMeta", "build_data_plane_client"]
