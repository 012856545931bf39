"""``Policy``: the driver-side facade of a policy spread over Ray workers, DTensor (FSDP2 + TP) or Megatron Core
(TP + PP + DP), whichever the config enables.

It validates a config given as a mapping, resolves the model name and checks every batch on the driver (so mistakes
surface as one clear exception, not a remote traceback), shards batches over data-parallel ranks and merges the
workers' results. Each bundle of the cluster hosts one worker (`DTensorPolicyWorker` or `MegatronPolicyWorker`);
ranks form a ``pipeline_parallel x data_parallel x tensor_parallel`` grid, the ranks of one TP group and of one
pipeline receive the same data and only one of them returns results (the workers hand the last stage's results to
every stage).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import ray
import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S
from nemo_rl_clone.distributed.worker_groups import (
    MODEL_WORKER_CLEANUP_TIMEOUT_S,
    MultiWorkerFuture,
    RayWorkerBuilder,
    RayWorkerGroup,
)
from nemo_rl_clone.models.generation.interfaces import check_one_train_rank
from nemo_rl_clone.models.huggingface import resolve_model_path
from nemo_rl_clone.models.policy.backend_checks import capability_problems
from nemo_rl_clone.models.policy.backends import backend_key, backend_spec, known_backend_spec, parallel_layout
from nemo_rl_clone.models.policy.batch_sharding import merge_shards, shard_batch
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.models.policy.interfaces import ColocatablePolicyInterface
from nemo_rl_clone.models.policy.megatron.config import local_spec_notes
from nemo_rl_clone.models.policy.nemo_rl_options import consolidated_folder, refuse_unbuilt_options
from nemo_rl_clone.models.policy.workers import train_profile
from nemo_rl_clone.models.policy.workers.optim import check_import_paths
from nemo_rl_clone.models.policy.workers.reward_model import check_input_lengths, reward_model_error
from nemo_rl_clone.models.policy.workers.topk_logits import check_k
from nemo_rl_clone.models.policy.workers.trained_rows import trained_rows_for
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import ConfigError, as_config
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.timer import Timer, timed

logger = logging.getLogger(__name__)


@dataclass
class TrainPlan:
    """What `Policy.train` hands its workers (one shard per DP rank, the common keyword arguments) and how it turns
    their results into its own; also used by a worker run in-process (the step replay, docs/debugging.md)."""

    shards: list[BatchedDataDict]
    kwargs: dict[str, Any]
    num_global_batches: int
    counts: dict[str, int]

    @classmethod
    def make(
        cls,
        cfg: PolicyConfig,
        dp_size: int,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        gbs: int,
        mbs: int,
        eval_mode: bool = False,
        *,
        router_aux_loss: bool,
    ) -> TrainPlan:
        """``router_aux_loss``: the workers' `has_router_aux_loss` (then no row is left out, see `trained_rows`)."""
        # A loss reading rows in groups (DPO/Bradley-Terry pairs) declares `rows_per_example`; packing keeps them whole.
        groups = {"rows_per_group": getattr(loss_fn, "rows_per_example", 1)} if cfg.sequence_packing.enabled else {}
        num_global_batches = data.size // gbs
        kwargs: dict[str, Any] = {"loss_fn": loss_fn, "eval_mode": eval_mode, "mbs": mbs}
        counts: dict[str, int] = {}
        trained = None if eval_mode else trained_rows_for(loss_fn, data, gbs, dp_size, router_aux_loss)
        if trained is not None:
            data, gbs = trained.data, trained.global_batch_size
            kwargs["loss_normalization"] = trained.normalization
            counts = {
                "num_trained_samples": trained.num_rows_with_gradient,
                "num_global_batches_with_metrics": trained.num_global_batches_with_metrics,
            }
        shards, _ = shard_batch(cfg, dp_size, data, "train", batch_size=gbs, **groups)
        return cls(shards, kwargs | {"gbs": gbs}, num_global_batches, counts)

    def result(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """`Policy.train`'s result from the workers' (one per DP rank, in rank order)."""
        all_mb_metrics: dict[str, list[Any]] = defaultdict(list)
        for result in results:
            for key, values in result["all_mb_metrics"].items():
                all_mb_metrics[key].extend(values)
        return {
            "loss": results[0]["global_loss"],
            "grad_norm": results[0]["grad_norm"],
            "all_mb_metrics": dict(all_mb_metrics),
            "num_global_batches": self.num_global_batches,
            **self.counts,
            **({"profile": train_profile.merge([r["profile"] for r in results])} if "profile" in results[0] else {}),
        }


class Policy(ColocatablePolicyInterface):
    """A Hugging Face causal LM trained with FSDP2 (+ DTensor TP) on the bundles of ``cluster``; with
    ``policy.reward_model_cfg.enabled`` a 1-label sequence-classification model (reward model) instead, whose
    `train` hands the loss scores ``[B, 1]`` and whose `score` replaces the logprob, refit and generation methods.

    Args:
        cluster: one worker per bundle; ``world_size / (tensor x pipeline parallel size)`` data-parallel ranks.
        config: the ``policy`` section: a `PolicyConfig` (validated where the config was loaded, used as is) or a
            NeMo-RL mapping, validated here.
        tokenizer: saved with checkpoints.
        name_prefix: Ray actor names ``{name_prefix}-{rank}``.
        init_optimizer / init_reference_model: see `DTensorPolicyWorker`.
        weights_path / optimizer_path: resume from a `save_checkpoint` output of the same backend (any DP size that
            divides the batch; the Megatron backend also reloads at other TP/PP sizes).
        env_vars: extra environment for the workers (e.g. ``OMP_NUM_THREADS`` when they time-share the cores).
        workers_per_node, processor, worker_extension_cls_fqn: NeMo-RL's; refused unless None (one worker per
            bundle; no multimodal processor; no worker extension class).

    Raises:
        ValueError: an invalid config (a mapping's bad keys and values, an optimizer or scheduler class path that
            does not exist, a model-parallel size that does not divide the workers, ...), naming the ``policy.*`` key.
        OSError: ``model_name`` is a path to no folder (whether a model loads is pre-flight's check; a worker
            reports weights that do not load).
    """

    def __init__(
        self,
        cluster: RayVirtualCluster,
        config: PolicyConfig | Mapping[str, Any],
        tokenizer: PreTrainedTokenizerBase,
        name_prefix: str = "lm_policy",
        workers_per_node: int | list[int] | None = None,
        init_optimizer: bool = True,
        weights_path: str | None = None,
        optimizer_path: str | None = None,
        init_reference_model: bool = True,
        processor: Any = None,
        worker_extension_cls_fqn: str | None = None,
        env_vars: dict[str, str] | None = None,
        wait: bool = True,
    ) -> None:
        """``wait=False`` returns while the workers are still starting (model load, sharding), so a caller can start
        the engines meanwhile; `wait_until_ready` must then come before any other call."""
        refuse_unbuilt_options(workers_per_node, processor, worker_extension_cls_fqn)
        # A PolicyConfig was validated where the config was loaded; a NeMo-RL mapping is validated here.
        self.cfg = as_config(config, PolicyConfig, key="policy")
        if init_optimizer:
            check_import_paths(self.cfg.optimizer, self.cfg.scheduler)
        for note in _unused_settings(self.cfg):
            logger.warning(note)
        # Whether the model loads is pre-flight's check (`check_model_source`); here it is only resolved.
        model_path = resolve_model_path(self.cfg.model_name)
        world_size = cluster.world_size()
        self.backend = backend_spec(self.cfg)
        # A registered backend's table was checked at validation; an import path's is checked here, once imported.
        problems = [] if known_backend_spec(self.cfg) else capability_problems(self.cfg, self.backend)
        if problems:
            raise ConfigError([f"policy.{key}: {message}" for key, message in problems])
        layout = parallel_layout(self.cfg, self.backend)
        tp_key, tp_size, pp_size = layout.inner_key, layout.inner_size, layout.pipeline_size
        if world_size % (tp_size * pp_size):
            sizes = f"policy.{tp_key}={tp_size}"
            if pp_size > 1:
                sizes += f" × pipeline_model_parallel_size={pp_size} ({tp_size * pp_size})"
            raise ValueError(f"{sizes} must divide the number of workers ({world_size})")
        self.dp_size = world_size // (tp_size * pp_size)
        self.is_reward_model = self.cfg.reward_model_cfg.enabled
        self._router_aux_loss: bool | None = None
        # Rank order: tensor-parallel ranks are neighbours, then data-parallel, pipeline stages outermost
        # (Megatron's layout; the DTensor backend has one stage).
        sharding = NamedSharding(
            np.arange(world_size).reshape(pp_size, self.dp_size, tp_size),
            ["pipeline_parallel", "data_parallel", "tensor_parallel"],
        )
        builder = RayWorkerBuilder(
            self.backend.worker,
            self.cfg,
            tokenizer,
            model_path,
            weights_path=weights_path,
            optimizer_path=optimizer_path,
            init_optimizer=init_optimizer,
            init_reference_model=init_reference_model,
        )
        backend_env = getattr(self.cfg, self.backend.section).env_vars
        if backend_env:
            env_vars = {**backend_env, **(env_vars or {})}
        self.worker_group = RayWorkerGroup(
            cluster, builder, name_prefix=name_prefix, sharding_annotations=sharding, env_vars=env_vars, wait=wait
        )

    def wait_until_ready(self) -> None:
        """Return once every worker has started (see ``wait`` in the constructor); raises if one failed."""
        self.worker_group.wait_until_constructed()

    # ------------------------------------------------------------------ logprobs
    def get_logprobs(
        self, data: BatchedDataDict, timer: Timer | None = None, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """``{"logprobs": [B, S] fp32}``; needs ``input_ids`` and ``input_lengths``. Any ``B >= dp`` works.
        ``timer``: times ``get_logprobs/shard_data`` and ``get_logprobs/submit_logprob_futures`` (NeMo-RL's labels;
        the second here until the results are back)."""
        self._require_language_model("get_logprobs")
        return self.sharded_call("get_logprobs", data, micro_batch_size, timer, "logprob")

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> BatchedDataDict:
        """``{"reference_logprobs": [B, S] fp32}`` under the initial weights (see `get_logprobs`)."""
        self._require_language_model("get_reference_policy_logprobs")
        method = "get_reference_policy_logprobs"
        return self.sharded_call(method, data, micro_batch_size, timer, "reference_policy_logprob")

    def get_topk_logits(
        self, data: BatchedDataDict, k: int, micro_batch_size: int | None = None, timer: Timer | None = None
    ) -> BatchedDataDict:
        """``{"topk_logits": [B, S, k] fp32, "topk_indices": [B, S, k] int64}``: the ``k`` largest next-token logits
        at every position (largest first) and their vocab ids, 0 at positions ``>= input_lengths`` (layout:
        `nemo_rl_clone.models.policy.workers.topk_logits`). Needs ``input_ids`` and ``input_lengths``; sharded like
        `get_logprobs`. A backend without ``topk_logits`` in its table (a plug-in's) raises NotImplementedError."""
        self._require_language_model("get_topk_logits")
        if not self.backend.topk_logits:
            raise NotImplementedError(
                f"Policy.get_topk_logits is not supported yet with policy.{backend_key(self.cfg)} (a distillation "
                "teacher needs a backend that has it: DTensor or Megatron)"
            )
        check_k(k)
        return self.sharded_call("get_topk_logits", data, micro_batch_size, timer, "topk_logits", k=k)

    def score(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """A reward model's ``{"scores": [B] fp32}`` (inference): the head at each row's ``input_lengths - 1``; with
        ``reward_model_type: regression`` (a PPO critic) ``[B, S]``: ``scores[:, t]`` is the value of the state in which
        token t is generated (the head at position t − 1; 0 at t = 0).

        Needs ``input_ids`` (right-padded) and ``input_lengths``; sharded over DP ranks like `get_logprobs`
        (dynamic batching included), microbatches of ``micro_batch_size`` (default ``logprob_batch_size``)."""
        if not self.is_reward_model:
            raise RuntimeError(
                "Policy.score needs a reward model (policy.reward_model_cfg.enabled=true); this policy is a causal "
                "LM: use get_logprobs"
            )
        return self.sharded_call("score", data, micro_batch_size)

    def sharded_call(
        self,
        method: str,
        data: BatchedDataDict,
        micro_batch_size: int | None,
        timer: Timer | None = None,
        futures_name: str = "",
        **kwargs: Any,
    ) -> BatchedDataDict:
        """The workers' ``method`` over ``data`` split by data-parallel rank (any ``B``), merged in ``data``'s order."""
        self._check_batch(data, ("input_ids", "input_lengths"), method)
        if self.is_reward_model:
            check_input_lengths(data, method)
        with timed(timer, f"{method}/shard_data"):
            shards, order = self._shard(data, "logprob", allow_uneven_shards=True)
        with timed(timer, f"{method}/submit_{futures_name}_futures"):
            results = self._run_sharded(method, shards, {"micro_batch_size": micro_batch_size, **kwargs})
        return merge_shards(results, order)

    # ------------------------------------------------------------------ training
    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Timer | None = None,
        check_dim_skip_keys: Iterable[str] | None = None,
    ) -> dict[str, Any]:
        """Train on ``data`` (``B`` a multiple of ``gbs``, default ``train_global_batch_size``); see `PolicyInterface`.
        A reward model also needs ``input_lengths`` (its scores are read at ``input_lengths - 1``).

        Returns ``loss`` and ``grad_norm`` (``[B // gbs]``, identical whatever the number of DP workers),
        ``all_mb_metrics`` (every microbatch of every DP rank) and ``num_global_batches``. A loss with
        ``rows_with_gradient`` gets only those rows run (`trained_rows`; same gradient; not when the model adds a router
        load-balancing loss, which every row shapes); the result then also holds
        ``num_trained_samples`` and ``num_global_batches_with_metrics`` (the loss's metrics other than ``loss`` are
        means over the rows that ran, and a global batch whose rows are all masked reports none).

        ``timer`` times ``policy_training/sharding_data`` and ``policy_training/submit_training_futures`` (NeMo-RL's
        labels; the second until the results are back). ``check_dim_skip_keys`` (NeMo-RL's tensors not aligned
        with ``input_ids``, of cross-tokenizer distillation) is refused.
        """
        if check_dim_skip_keys:
            raise UserInputError(
                "Policy.train: check_dim_skip_keys: not supported yet: tensors not aligned with input_ids "
                "(cross-tokenizer distillation)"
            )
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        if self.is_reward_model:
            self._check_batch(data, ("input_ids", "input_lengths", "sample_mask"), "train")
            check_input_lengths(data, "train")
        else:
            self._check_batch(data, ("input_ids", "sample_mask"), "train")
        if gbs % self.dp_size:
            raise ValueError(
                f"train: global batch size {gbs} (policy.train_global_batch_size or gbs=) must be divisible by the "
                f"data-parallel size {self.dp_size}"
            )
        if data.size % gbs:
            raise ValueError(f"train: batch of {data.size} samples is not a multiple of the global batch size {gbs}")
        if self.is_reward_model and self.cfg.reward_model_cfg.reward_model_type == "bradley_terry":
            _check_pairs_stay_together(self.cfg, gbs // self.dp_size, mbs)
        aux = self._has_router_aux_loss()
        with timed(timer, "policy_training/sharding_data"):
            plan = TrainPlan.make(self.cfg, self.dp_size, data, loss_fn, gbs, mbs, eval_mode, router_aux_loss=aux)
        with timed(timer, "policy_training/submit_training_futures"):
            results = self._run_sharded("train", plan.shards, plan.kwargs)
        return plan.result(results)

    # ------------------------------------------------------------------ lifecycle
    def prepare_for_training(self) -> None:
        self._run_all("prepare_for_training")

    def prepare_for_lp_inference(self) -> None:
        self._run_all("prepare_for_lp_inference")

    def finish_training(self) -> None:
        self._run_all("finish_training")

    def offload_before_refit(self) -> None:
        self._run_all("offload_before_refit")

    def offload_after_refit(self) -> None:
        self._run_all("offload_after_refit")

    def prepare_refit_info(self) -> dict[str, tuple[torch.Size, torch.dtype]]:
        self._require_language_model("prepare_refit_info")
        return ray.get(self.worker_group.run_single_worker_single_data("prepare_refit_info", 0))

    def get_full_state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        """The full state dict gathered by every worker and returned from rank 0 (CPU, compute dtype)."""
        self._require_language_model("get_full_state_dict_for_refit")
        return self._run_all("get_full_state_dict_for_refit")[0]

    def get_packed_state_dict_ref_for_refit(self) -> ray.ObjectRef:
        """An object-store reference to rank 0's packed full state dict (colocated refit without a driver copy)."""
        self._require_language_model("get_packed_state_dict_ref_for_refit")
        refs = self.worker_group.run_all_workers_single_data("get_packed_state_dict_for_refit")
        MultiWorkerFuture(refs, group_name=self.worker_group.name).get_results()  # raise any worker's error
        return refs[0]

    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[ray.ObjectRef]:
        """Futures of every worker joining the weight-transfer group at ``ip:port`` (rank 0 is its member 0, the
        only train rank in it: `check_one_train_rank`)."""
        check_one_train_rank(train_world_size)
        self._require_language_model("init_collective")
        return self.worker_group.run_all_workers_single_data(
            "init_collective", ip, port, world_size, timeout_s=timeout_s
        )

    def broadcast_weights_for_collective(
        self, kv_scales: Mapping[str, float] | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> list[ray.ObjectRef]:
        """Futures of the broadcast from rank 0 (await together with the engines' receive futures). ``kv_scales``
        (NeMo-RL's trainer-calibrated FP8 KV-cache scales, sent with the weights) is refused."""
        if kv_scales is not None:
            raise UserInputError("broadcast_weights_for_collective: kv_scales: not supported yet: KV-cache scales")
        self._require_language_model("broadcast_weights_for_collective")
        return self.worker_group.run_all_workers_single_data(
            "broadcast_weights_for_collective", bucket_bytes=bucket_bytes
        )

    def save_checkpoint(
        self,
        weights_path: str,
        optimizer_path: str | None = None,
        tokenizer_path: str | None = None,
        checkpointing_cfg: CheckpointingConfig | Mapping[str, Any] | None = None,
        save_hf_path: str | None = None,
        save_hf_format: str = "safetensors",
    ) -> None:
        """Sharded DCP weights (and optimizer + scheduler), tokenizer files, optional consolidated HF folder
        (``save_hf_format``: ``checkpointing.model_save_format``). ``checkpointing_cfg`` (NeMo-RL's: the
        ``checkpointing`` section) with ``save_consolidated`` writes that folder as ``hf`` beside ``weights_path``."""
        save_hf_path, save_hf_format = consolidated_folder(
            weights_path, checkpointing_cfg, save_hf_path, save_hf_format
        )
        self._run_all(
            "save_checkpoint",
            weights_path,
            optimizer_path=optimizer_path,
            tokenizer_path=tokenizer_path,
            save_hf_path=save_hf_path,
            save_hf_format=save_hf_format,
        )

    def shutdown(self) -> bool:
        return self.worker_group.shutdown(cleanup_method="shutdown", timeout=MODEL_WORKER_CLEANUP_TIMEOUT_S)

    # ------------------------------------------------------------------ helpers
    def _require_language_model(self, method: str) -> None:
        if self.is_reward_model:
            raise reward_model_error(f"Policy.{method}")

    def _has_router_aux_loss(self) -> bool:
        """The workers' `has_router_aux_loss`, asked at the first `train` (the workers may still be starting in the
        constructor)."""
        if self._router_aux_loss is None:
            self._router_aux_loss = bool(self._run_all("has_router_aux_loss")[0])
            if self._router_aux_loss:
                logger.info("policy: a router load-balancing loss is on, so every sample trains (see trained_rows)")
        return self._router_aux_loss

    def _run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        refs = self.worker_group.run_all_workers_single_data(method, *args, **kwargs)
        future = MultiWorkerFuture(refs, group_name=self.worker_group.name, method_name=method)
        return self.worker_group.get_all_worker_results(future)

    def _run_sharded(self, method: str, shards: list[BatchedDataDict], kwargs: dict[str, Any]) -> list[Any]:
        future = self.worker_group.run_all_workers_sharded_data(
            method,
            shards,
            in_sharded_axes=["data_parallel"],
            replicate_on_axes=["pipeline_parallel", "tensor_parallel"],
            output_is_replicated=["pipeline_parallel", "tensor_parallel"],
            common_kwargs=kwargs,
        )
        return self.worker_group.get_all_worker_results(future)

    def _check_batch(self, data: BatchedDataDict, keys: tuple[str, ...], method: str) -> None:
        if not isinstance(data, BatchedDataDict):
            raise TypeError(f"{method}: data must be a BatchedDataDict, got {type(data).__name__}")
        missing = [key for key in keys if key not in data]
        if missing:
            raise KeyError(f"{method}: data is missing {missing}; it has {sorted(data)}")
        if data.size < self.dp_size:
            raise ValueError(
                f"{method}: batch of {data.size} samples is smaller than the data-parallel size {self.dp_size}; "
                "every data-parallel worker needs at least one sample"
            )

    def _shard(
        self, data: BatchedDataDict, phase: Literal["train", "logprob"], **kwargs: Any
    ) -> tuple[list[BatchedDataDict], list[int] | None]:
        return shard_batch(self.cfg, self.dp_size, data, phase, **kwargs)


def _check_pairs_stay_together(config: PolicyConfig, rank_batch_size: int, mbs: int) -> None:
    """Bradley-Terry rows come as (chosen, rejected) neighbours; every microbatch must hold whole pairs."""
    if config.dynamic_batching.enabled:
        raise ValueError(
            "train: policy.dynamic_batching.enabled sorts rows by length, which separates a reward model's "
            "chosen/rejected pairs; disable it for reward-model training (Policy.score supports it)"
        )
    if rank_batch_size % 2 or mbs % 2:
        raise ValueError(
            f"train: a reward model trains on (chosen, rejected) row pairs, so the per-rank batch (global batch / "
            f"data-parallel size = {rank_batch_size}) and the micro batch size ({mbs}) must both be even"
        )


def _unused_settings(config: PolicyConfig) -> list[str]:
    """Settings of NeMo-RL recipes that validate but have no effect with this config, one log line each."""
    if backend_spec(config).section != "megatron_cfg":
        return []
    notes = local_spec_notes(config.megatron_cfg)
    if config.scheduler is not None:
        # NeMo-RL's Megatron recipes inherit the DTensor schedule list; its Megatron worker ignores it as well.
        notes.append(
            "policy.scheduler is not used by the Megatron backend: its learning-rate schedule is "
            "policy.megatron_cfg.scheduler (set policy.scheduler=null to silence this)"
        )
    if config.optimizer is not None:
        notes.append(
            "policy.optimizer is not used by the Megatron backend: it builds its optimizer from "
            "policy.megatron_cfg.optimizer (set policy.optimizer=null to silence this)"
        )
    clip, norm = config.megatron_cfg.optimizer.clip_grad, config.max_grad_norm
    if clip != norm and not (clip in (None, 0.0) and norm in (None, 0.0)):
        notes.append(
            f"policy.max_grad_norm ({norm}) is not used by the Megatron backend: it clips gradients at "
            f"policy.megatron_cfg.optimizer.clip_grad ({clip}); write ${{policy.max_grad_norm}} there to share one value"
        )
    if config.dtensor_cfg.context_parallel_size != 1:
        notes.append(
            "policy.dtensor_cfg.context_parallel_size is the DTensor backend's; the Megatron backend splits sequences "
            "with megatron_cfg.context_parallel_size"
        )
    return notes
