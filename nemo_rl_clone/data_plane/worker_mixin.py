"""`TQWorkerMixin`: the policy-worker methods that take a `KVBatchMeta` in place of a batch (every policy worker has
them; they need `setup_data_plane` first). A worker reads its own rows from the queue and writes its per-token
results back under the same keys, so neither passes through the driver."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from nemo_rl_clone.data_plane.factory import build_data_plane_client
from nemo_rl_clone.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

# ``KVBatchMeta.extra_info`` key: the rank's microbatch plan (dynamic batching / sequence packing), made by the driver.
MICROBATCH_PLAN = "microbatch_plan"
# The columns the logprob passes write, named as the training batch names them.
PREV_LOGPROBS = "prev_logprobs"
REFERENCE_LOGPROBS = "reference_policy_logprobs"


class TQWorkerMixin:
    """Mixed into `PolicyWorkerBase`: its ``get_logprobs`` / ``get_reference_policy_logprobs`` / ``train`` fed from
    the data plane. ``writer_ranks``: the ranks that write a result (one per data-parallel group; its tensor- and
    pipeline-parallel peers computed the same values)."""

    rank: int
    _data_plane: DataPlaneClient | None = None

    def setup_data_plane(self, cfg: Any) -> None:
        """Connect this worker to the queue the driver started."""
        self._data_plane = build_data_plane_client(cfg, bootstrap=False)

    def get_logprobs_presharded(
        self, meta: KVBatchMeta, writer_ranks: Collection[int], micro_batch_size: int | None = None
    ) -> None:
        logprobs = self.get_logprobs(self._fetch(meta), micro_batch_size)["logprobs"]  # type: ignore[attr-defined]
        self._write_back(meta, writer_ranks, PREV_LOGPROBS, logprobs)

    def get_reference_policy_logprobs_presharded(
        self, meta: KVBatchMeta, writer_ranks: Collection[int], micro_batch_size: int | None = None
    ) -> None:
        data = self._fetch(meta)
        logprobs = self.get_reference_policy_logprobs(data, micro_batch_size)["reference_logprobs"]  # type: ignore[attr-defined]
        self._write_back(meta, writer_ranks, REFERENCE_LOGPROBS, logprobs)

    def train_presharded(self, meta: KVBatchMeta, **train_kwargs: Any) -> dict[str, Any]:
        return self.train(self._fetch(meta), **train_kwargs)  # type: ignore[attr-defined]

    def _client(self) -> DataPlaneClient:
        if self._data_plane is None:
            raise RuntimeError("this worker is not connected to a data plane; call setup_data_plane first")
        return self._data_plane

    def _fetch(self, meta: KVBatchMeta) -> BatchedDataDict:
        """This rank's rows, in the meta's order, with the driver's microbatch plan."""
        data = BatchedDataDict(self._client().get_samples(meta.sample_ids, meta.partition_id, meta.fields))
        data.microbatch_plan = meta.extra_info.get(MICROBATCH_PLAN)
        return data

    def _write_back(self, meta: KVBatchMeta, writer_ranks: Collection[int], name: str, values: torch.Tensor) -> None:
        if self.rank in writer_ranks:
            self._client().put_samples(meta.sample_ids, meta.partition_id, {name: values.contiguous()})
