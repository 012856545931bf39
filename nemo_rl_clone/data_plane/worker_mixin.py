"""`TQWorkerMixin`: the policy-worker methods that take a `KVBatchMeta` in place of a batch (every policy worker has
them; they need `setup_data_plane` first). A worker reads its own rows from the queue and writes its per-token
results back under the same keys, so neither passes through the driver."""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.data_plane.factory import build_data_plane_client
from nemo_rl_clone.data_plane.interfaces import DataPlaneClient, KVBatchMeta
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict

# ``KVBatchMeta.extra_info`` keys, set by the driver: the rank's microbatch plan (dynamic batching / sequence
# packing), and the ranks that write a pass's results (one per data-parallel group: its tensor- and
# pipeline-parallel peers computed the same values).
MICROBATCH_PLAN = "microbatch_plan"
WRITER_RANKS = "writer_ranks"
# The columns the logprob passes write, named as the training batch names them.
PREV_LOGPROBS = "prev_logprobs"
REFERENCE_LOGPROBS = "reference_policy_logprobs"


class TQWorkerMixin:
    """Mixed into `PolicyWorkerBase`: its ``get_logprobs`` / ``get_reference_policy_logprobs`` / ``train`` fed from
    the data plane."""

    rank: int
    _dp_client: DataPlaneClient | None = None

    def setup_data_plane(self, cfg: Any) -> None:
        """Connect this worker to the queue the driver started."""
        self._dp_client = build_data_plane_client(cfg, bootstrap=False)

    def get_logprobs_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        logprobs = self.get_logprobs(self._fetch(meta), micro_batch_size)["logprobs"]  # type: ignore[attr-defined]
        self._write_back(meta, PREV_LOGPROBS, logprobs)

    def get_reference_policy_logprobs_presharded(self, meta: KVBatchMeta, micro_batch_size: int | None = None) -> None:
        data = self._fetch(meta)
        logprobs = self.get_reference_policy_logprobs(data, micro_batch_size)["reference_logprobs"]  # type: ignore[attr-defined]
        self._write_back(meta, REFERENCE_LOGPROBS, logprobs)

    def train_presharded(
        self,
        meta: KVBatchMeta,
        loss_fn: Any,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        loss_normalization: list[tuple[float, float]] | None = None,
    ) -> dict[str, Any]:
        data = self._fetch(meta)
        return self.train(data, loss_fn, eval_mode, gbs, mbs, loss_normalization)  # type: ignore[attr-defined]

    def _client(self) -> DataPlaneClient:
        if self._dp_client is None:
            raise RuntimeError("this worker is not connected to a data plane; call setup_data_plane first")
        return self._dp_client

    def _fetch(self, meta: KVBatchMeta) -> BatchedDataDict:
        """This rank's rows, in the meta's order, with the driver's microbatch plan."""
        data = BatchedDataDict(self._client().get_samples(meta.sample_ids, meta.partition_id, meta.fields))
        data.microbatch_plan = meta.extra_info.get(MICROBATCH_PLAN)
        return data

    def _write_back(self, meta: KVBatchMeta, name: str, values: torch.Tensor) -> None:
        if self.rank in meta.extra_info[WRITER_RANKS]:
            self._client().put_samples(meta.sample_ids, meta.partition_id, {name: values.contiguous()})
