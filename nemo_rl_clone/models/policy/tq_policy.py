"""`TQPolicy`: the policy of a run with ``data_plane.enabled`` (NeMo-RL's name and constructor: ``TQPolicy(**kwargs,
dp_cfg=...)``). A step's training rows are written to the queue once (`write_batch`); the logprob passes and training
then hand each data-parallel rank the keys of its rows (`KVBatchMeta`), the ranks read their rows from the queue,
and the logprobs they compute are written back there under the same keys, where training reads them: no per-token
result comes back to the driver. Which rows a rank gets and in which microbatches is decided on the driver exactly
as `Policy` decides it, from the rows the driver wrote, so a run through the queue computes what a plain run does.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.data_plane import KVBatchMeta, build_data_plane_client
from nemo_rl_clone.data_plane.worker_mixin import MICROBATCH_PLAN, WRITER_RANKS
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.worker_group_dispatch import plan_sharded_call
from nemo_rl_clone.distributed.worker_groups import MultiWorkerFuture
from nemo_rl_clone.models.policy.lm_policy import Policy, TrainPlan
from nemo_rl_clone.utils.timer import Timer, timed

# A column only the driver's planning copy has: each row's index, so that a planned shard names its keys.
_ROW = "_data_plane_row"
_REPLICATED = ["pipeline_parallel", "tensor_parallel"]


class TQPolicy(Policy):
    """`Policy` whose data moves through the data plane. ``dp_cfg``: the ``data_plane`` section; this driver starts
    the queue and stops it at `shutdown`. ``tq_partition_id``: the partition a step's rows are written to."""

    def __init__(self, *args: Any, dp_cfg: Any, tq_partition_id: str = "train", **kwargs: Any) -> None:
        self.dp_cfg = dp_cfg
        self.dp_client = build_data_plane_client(dp_cfg, bootstrap=True)
        self.tq_partition_id = tq_partition_id
        self._written: dict[str, BatchedDataDict] = {}  # partition → the rows the driver wrote (its planning copy)
        self._workers_connected = False
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self.dp_client.close()
            raise
        if kwargs.get("wait", True):
            self._connect_workers()

    def wait_until_ready(self) -> None:
        super().wait_until_ready()
        self._connect_workers()

    def _connect_workers(self) -> None:
        if not self._workers_connected:
            self.dp_client.wait_until_started()
            self._run_all("setup_data_plane", self.dp_cfg)
            self._workers_connected = True

    # ------------------------------------------------------------------ rows in and out
    def write_batch(self, data: BatchedDataDict, step: int) -> KVBatchMeta:
        """Write ``data``'s rows (keys ``<step>_<row>``) to the partition; the handle the other methods take."""
        keys = [f"{step}_{row}" for row in range(data.size)]
        columns = {name: value for name, value in data.items() if isinstance(value, torch.Tensor)}
        skipped = sorted(set(data) - set(columns))
        if skipped:
            raise ValueError(f"data plane: only tensor columns are written; {skipped} are not tensors")
        self.dp_client.put_samples(keys, self.tq_partition_id, columns)
        self._written[self.tq_partition_id] = data
        lengths = data["input_lengths"].tolist() if "input_lengths" in data else []
        return KVBatchMeta(self.tq_partition_id, "train", keys, sorted(columns), lengths)

    def read_from_dataplane(
        self, meta: KVBatchMeta, *, select_fields: list[str], pad_value_dict: dict[str, Any] | None = None
    ) -> BatchedDataDict:
        """The ``select_fields`` columns of ``meta``'s rows, in its order. Rows are written at the batch's padded
        width and come back at it, so NeMo-RL's ``pad_value_dict`` (padding ragged rows) has nothing to pad."""
        if pad_value_dict:
            raise ValueError("read_from_dataplane: pad_value_dict: rows come back at their written (padded) width")
        return BatchedDataDict(self.dp_client.get_samples(meta.sample_ids, meta.partition_id, select_fields))

    def write_to_dataplane(self, meta: KVBatchMeta, fields: dict[str, torch.Tensor]) -> None:
        """Write (or replace) columns of ``meta``'s rows; the driver's planning copy follows."""
        self.dp_client.put_samples(meta.sample_ids, meta.partition_id, fields)
        rows = self._written.get(meta.partition_id)
        if rows is not None and rows.size == meta.size:
            rows.update(fields)
        meta.fields = sorted(set(meta.fields) | set(fields))

    def discard_samples(self, sample_ids: list[str], partition_id: str) -> None:
        self.dp_client.clear_samples(sample_ids, partition_id)

    def finish_step(self, meta: KVBatchMeta) -> None:
        """Drop the step's rows from the queue."""
        self.discard_samples(meta.sample_ids, meta.partition_id)
        self._written.pop(meta.partition_id, None)

    # ------------------------------------------------------------------ the passes
    def get_logprobs_from_meta(
        self, meta: KVBatchMeta, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> None:
        """`Policy.get_logprobs` of ``meta``'s rows; each rank writes its rows' ``prev_logprobs``."""
        self._logprob_pass("get_logprobs_presharded", meta, micro_batch_size, timer)
        meta.fields = sorted({*meta.fields, "prev_logprobs"})

    def get_reference_policy_logprobs_from_meta(
        self, meta: KVBatchMeta, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> None:
        """`Policy.get_reference_policy_logprobs`; each rank writes its rows' ``reference_policy_logprobs``."""
        self._logprob_pass("get_reference_policy_logprobs_presharded", meta, micro_batch_size, timer)
        meta.fields = sorted({*meta.fields, "reference_policy_logprobs"})

    def train_from_meta(
        self,
        meta: KVBatchMeta,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Timer | None = None,
    ) -> dict[str, Any]:
        """`Policy.train` on ``meta``'s rows with every column written so far (the logprobs included)."""
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        view = self._planning_view(meta)
        with timed(timer, "policy_training/sharding_data"):
            aux = self._has_router_aux_loss()
            plan = TrainPlan.make(self.cfg, self.dp_size, view, loss_fn, gbs, mbs, eval_mode, router_aux_loss=aux)
        with timed(timer, "policy_training/submit_training_futures"):
            results = self._presharded("train_presharded", meta, plan.shards, plan.kwargs)
        return plan.result(results)

    def shutdown(self) -> bool:
        try:
            return super().shutdown()
        finally:
            self.dp_client.close()

    # ------------------------------------------------------------------ helpers
    def _logprob_pass(self, method: str, meta: KVBatchMeta, micro_batch_size: int | None, timer: Timer | None) -> None:
        view = self._planning_view(meta)
        name = method.removesuffix("_presharded")
        with timed(timer, f"{name}/shard_data"):
            shards, _ = self._shard(view, "logprob", allow_uneven_shards=True)
        with timed(timer, f"{name}/submit_logprob_futures"):
            self._presharded(method, meta, shards, {"micro_batch_size": micro_batch_size})

    def _planning_view(self, meta: KVBatchMeta) -> BatchedDataDict:
        """The driver's copy of ``meta``'s rows with their row indices: what `Policy` plans shards from."""
        rows = self._written.get(meta.partition_id)
        if rows is None or rows.size != meta.size:
            raise ValueError(f"data plane: {meta.partition_id!r} holds no rows written by write_batch for this meta")
        return BatchedDataDict({**rows, _ROW: torch.arange(rows.size)})

    def _presharded(
        self, method: str, meta: KVBatchMeta, shards: list[BatchedDataDict], kwargs: dict[str, Any]
    ) -> list[Any]:
        """Call ``method`` on every rank with the handle of its shard's rows (and the shard's microbatch plan)."""
        sharding = self.worker_group.sharding_annotations
        writers = plan_sharded_call(sharding, ["data_parallel"], _REPLICATED, _REPLICATED).return_ranks
        metas = []
        for shard in shards:
            rank_meta = meta.subset(shard[_ROW].tolist())
            rank_meta.extra_info |= {MICROBATCH_PLAN: shard.microbatch_plan, WRITER_RANKS: writers}
            metas.append(rank_meta)
        future: MultiWorkerFuture = self.worker_group.run_all_workers_sharded_data(
            method,
            metas,
            in_sharded_axes=["data_parallel"],
            replicate_on_axes=_REPLICATED,
            output_is_replicated=_REPLICATED,
            common_kwargs=kwargs,
        )
        return self.worker_group.get_all_worker_results(future)


__all__ = ["TQPolicy"]
