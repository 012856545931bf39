"""``VllmGenerationWorker``: one vLLM engine inside a Ray actor (one per data-parallel generation rank).

The engine runs in the actor's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): on CPU it starts in ~3 s
instead of ~30 s and weights can be handed to it as Python objects. With ``vllm_cfg.async_engine`` it is vLLM's
AsyncLLM instead (`async_engine.AsyncEngine`, the same calls), whose engine core runs in a child process. ``vllm``
is imported inside methods, so the driver can import this module (and build the actor class) without vLLM installed.

Weight updates (refit) never load a partial or mismatched set: new weights are fully received and checked
(names and shapes against the model's checkpoint and the trainer's `prepare_refit_info`) *before* the engine's
``reload_weights`` runs; any failure up to that point raises and the old weights keep serving. The prefix cache is
reset after every update (stale KV blocks would otherwise be reused: trainer-vs-engine logprob gaps of ~1 instead
of ~1e-6).

In-flight weight updates (``weight_updates_during_generation``, async GRPO's ``in_flight_weight_updates``): the actor
runs two calls at once (``max_concurrency=2``) and `generate` drives the engine one step at a time, so that a weight
update arriving from the trainer is loaded between two steps of the batch in flight instead of waiting for its end.
Requests already running continue with the new weights on the KV cache the old ones computed (the prefix cache is
reset as soon as no request runs: new requests never reuse old blocks).

Files: vLLM writes its IPC sockets and ``file://`` rendezvous files to the temp dir; each worker gets a private
one (``tmp_dir``) that `shutdown` deletes, together with ``/dev/shm`` segments its engine had mapped.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import torch
from transformers import AutoConfig

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.weight_transfer import (
    DEFAULT_BUCKET_BYTES,
    PackedTensors,
    TensorSpec,
    WeightTransferError,
    WeightTransferGroup,
    describe_spec_mismatch,
    receive_state_dict,
    specs_from_info,
    unpack_tensors,
)
from nemo_rl_clone.models.generation.config import GenerationConfig
from nemo_rl_clone.models.generation.interfaces import RefitError
from nemo_rl_clone.models.generation.vllm import engine_io
from nemo_rl_clone.models.generation.vllm.async_engine import AsyncEngine
from nemo_rl_clone.models.generation.vllm.engine_extension import EXTENSION, pack_for_engine_core
from nemo_rl_clone.models.policy.workers.train_profile import peak_rss_bytes

logger = logging.getLogger(__name__)

TIED_HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


def _freeze_imported_heap() -> None:
    """Move what the imports built (torch, transformers, vLLM: ~650k objects) out of the cyclic collector's reach
    before the engine is built. vLLM collects five times while it builds one and freezes the heap itself when done;
    frozen first, those collections skip the imports (the tiny model's engine: 3.4 -> 2.1 CPU-seconds). Objects
    are still freed by reference counting; only cycles among these already-living ones are never collected."""
    import vllm.entrypoints.llm  # noqa: F401  (the engine's modules, so that they are frozen too)

    gc.collect()
    gc.freeze()


class VllmGenerationWorker:
    """One vLLM engine. Methods are called by `VllmGeneration`; see there for the batch formats.

    Args:
        config: the ``policy.generation`` section.
        model_path: a local Hugging Face folder (or hub id) with the initial weights and tokenizer.
        seed: base seed; this engine uses ``seed + rank`` (sampling without per-sample seeds draws from it).
        tmp_root: this worker's vLLM IPC files go to ``{tmp_root}/rank{rank}``, removed by `shutdown`.
        weight_updates_during_generation: step the engine in `generate` so that weight updates (from a second
            concurrent call) land between steps; the actor must allow two concurrent calls.
        hf_config_overrides: ``policy.hf_config_overrides``, applied to the engine's model config.
        engine_gpu_ids: per engine rank, the GPU ids of its bundles (GPU engines of several tensor/pipeline ranks).
    """

    def __init__(
        self,
        config: GenerationConfig,
        model_path: str,
        seed: int = 0,
        tmp_root: str | None = None,
        weight_updates_during_generation: bool = False,
        hf_config_overrides: Mapping[str, Any] | None = None,
        served_model_name: str | None = None,
        record_routing: bool = False,
        engine_gpu_ids: list[list[str]] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.cfg = config
        self.rank = int(os.environ.get("RANK", "0"))
        if engine_gpu_ids is not None:  # a GPU engine of several ranks: its bundles' GPUs, before CUDA starts
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(engine_gpu_ids[self.rank])
        self.tmp_dir = _use_private_tmp_dir(os.path.join(tmp_root, f"rank{self.rank}")) if tmp_root else None
        self.on_gpu = torch.cuda.is_available()
        os.environ.update(engine_io.engine_env(config, self.on_gpu))
        if config.vllm_cfg.enforce_eager:
            # Eager means no torch.compile in this process at all: vLLM still compiles two small sampler helpers
            # (the sampled token's rank, random sampling) with inductor, a C++ build of 8-15 s on a CPU at the first
            # generate of every engine. Eager, they give the same numbers.
            torch._dynamo.config.disable = True
        kwargs = engine_io.engine_kwargs(config, model_path, seed + self.rank, self.on_gpu, hf_config_overrides)
        if record_routing:  # a prompt token served from the prefix cache is not computed: its routing would be lost
            kwargs["enable_prefix_caching"] = False
        self.is_async = config.vllm_cfg.async_engine
        self.http_url: str | None = None
        _freeze_imported_heap()
        if self.is_async:
            self.llm: Any = AsyncEngine({**kwargs, "worker_extension_cls": EXTENSION})
            if config.vllm_cfg.expose_http_server:  # on this node's address only, a port the OS picks
                self.http_url = self.llm.serve_openai(
                    model_path,
                    served_model_name or model_path,
                    ray.util.get_node_ip_address(),
                    dict(config.vllm_cfg.http_server_serving_chat_kwargs or {}),
                    api_key,
                )
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            from vllm import LLM

            self.llm = LLM(**kwargs, worker_extension_cls=EXTENSION)
        if config.vllm_cfg.pipeline_parallel_size > 1:
            self.llm.collective_rpc("prepare_pipeline_stage")
        if engine_io.engine_sampler(config.vllm_cfg, self.on_gpu) == "inverse_cdf":
            self.llm.collective_rpc("use_inverse_cdf_sampler")
        # Stats are on for `PhaseStats`' per-request timestamps; their periodic console summary is noise here.
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        # From the folder's config: vLLM may rewrite the flag in its own copy (it reports False for tied models).
        self.tied_head = bool(AutoConfig.from_pretrained(model_path).get_text_config().tie_word_embeddings)
        self.checkpoint_specs = engine_io.checkpoint_specs(model_path)
        self.refit_specs: list[TensorSpec] | None = None
        # `policy.router_replay` (validation: the in-process engine, so records come back with the outputs)
        self.record_routing = record_routing
        if record_routing:
            self.llm.collective_rpc("record_routing")
        self.transfer_group: WeightTransferGroup | None = None
        self.broken: str | None = None  # set when a load failed half-way: the engine must not serve any more
        self.asleep = False
        self.phase_stats = engine_io.PhaseStats()
        # The async engine takes weight loads between its steps by itself: no step-by-step driving needed.
        self.stepwise = weight_updates_during_generation and not self.is_async
        self._engine_turn = threading.Condition()  # one engine step or one weight load at a time
        self._loads_waiting = 0
        # Guards only the counter: a load announces itself without the engine's lock, which the step loop of a batch
        # in flight releases and takes back at once (Python's locks are not fair: the load would wait for the end).
        self._loads_lock = threading.Lock()
        self._prefix_cache_stale = False
        self.in_flight_loads = 0  # weight loads that landed while requests were running

    # ------------------------------------------------------------------ generation
    def generate(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """Generate for this worker's shard (see `VllmGeneration.generate` for keys and shapes)."""
        self._check_serving()
        requests = engine_io.token_requests(data, self.cfg, greedy, self.llm.llm_engine.model_config.max_model_len)
        prompts, params = [r.prompt for r in requests], [r.params for r in requests]
        if self.stepwise:
            outputs = self._generate_stepwise(prompts, params)
        elif self.is_async:  # without the engine's turn: a weight load may land while this batch runs
            with self._engine_turn:
                self._reset_stale_prefix_cache()
            outputs = self.llm.generate(prompts, params)
        else:
            with self._engine_turn:
                outputs = self.llm.generate(prompts, params, use_tqdm=self.cfg.vllm_cfg.use_tqdm)
        self.phase_stats.add(outputs)
        routing = None
        if self.record_routing:
            per_rank = self.llm.collective_rpc("take_routing", args=([out.request_id for out in outputs],))
            routing = _join_pipeline_stages(per_rank, self.cfg.vllm_cfg.tensor_parallel_size)
        return engine_io.assemble_outputs(data, outputs, self.get_pad_token_id(), routing)

    def _generate_stepwise(self, prompts: list[Any], params: list[Any]) -> list[Any]:
        """`LLM.generate`, one engine step per turn of ``_engine_turn``; a waiting weight load goes first."""
        engine = self.llm.llm_engine
        with self._engine_turn:
            self._reset_stale_prefix_cache()
            self.llm.enqueue(prompts, params, use_tqdm=self.cfg.vllm_cfg.use_tqdm)
        finished: dict[str, Any] = {}
        while True:
            with self._engine_turn:
                self._engine_turn.wait_for(lambda: self._loads_waiting == 0)
                if not engine.has_unfinished_requests():
                    self._reset_stale_prefix_cache()
                    break
                finished.update((out.request_id, out) for out in engine.step() if out.finished)
        # As `LLM.generate` orders them: outputs carry the request counter as their id.
        return sorted(finished.values(), key=lambda out: int(out.request_id))

    def _reset_stale_prefix_cache(self) -> None:
        if self._prefix_cache_stale and self.llm.reset_prefix_cache():
            self._prefix_cache_stale = False

    @contextmanager
    def _load_turn(self) -> Iterator[None]:
        """The engine between two steps of a batch in flight (at once when none is)."""
        with self._loads_lock:
            self._loads_waiting += 1  # the step loop sees it before its next step and lets this load go first
        try:
            with self._engine_turn:
                yield
        finally:
            with self._engine_turn:
                with self._loads_lock:
                    self._loads_waiting -= 1
                self._engine_turn.notify_all()

    def take_phase_stats(self) -> engine_io.PhaseStats:
        """The prefill/decode stats of the `generate` calls since the last take (then reset)."""
        stats, self.phase_stats = self.phase_stats, engine_io.PhaseStats()
        stats.peak_rss_bytes = peak_rss_bytes()  # the sync engine runs in this process
        if self.is_async:  # and the async engine's core in children of it
            stats.peak_rss_bytes += sum(_peak_rss_of(pid) for pid in self.llm.engine_core_pids())
        return stats

    def generate_text(self, data: BatchedDataDict, greedy: bool = False) -> BatchedDataDict:
        """``{"texts": [str]}``: the continuation of each of ``data["prompts"]`` (stop strings included)."""
        self._check_serving()
        prompts, params = engine_io.text_requests(data, self.cfg, greedy)
        with self._engine_turn:
            outputs = self.llm.generate(prompts, params, use_tqdm=self.cfg.vllm_cfg.use_tqdm)
        self.phase_stats.add(outputs)
        return BatchedDataDict({"texts": [out.outputs[0].text for out in outputs]})

    def get_http_url(self) -> str | None:
        """This engine's OpenAI-compatible base URL (``.../v1``), None without ``expose_http_server``."""
        return self.http_url

    def take_served_calls(self, episode_ids: list[str]) -> dict[str, list[Any]]:
        """The `ServedCall` records of these episodes' HTTP calls to this engine (``expose_http_server``); only
        episodes it served are keys."""
        return self.llm.take_served_calls(episode_ids)

    def get_pad_token_id(self) -> int:
        """The tokenizer's pad id (its EOS id when it has none, as `load_tokenizer` does)."""
        tokenizer = self.llm.get_tokenizer()
        return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)

    # ------------------------------------------------------------------ memory around training (colocated)
    def prepare_for_generation(self, tags: list[str] | None = None) -> None:
        """GPU: wake the engine (``tags``: ``["weights"]`` / ``["kv_cache"]`` / None for all). CPU: nothing to do,
        vLLM has no sleep mode there and the engine stays resident in RAM."""
        if self.on_gpu and self.asleep:
            self.llm.wake_up(tags=tags)
            self.asleep = tags is not None and "kv_cache" not in tags

    def finish_generation(self) -> None:
        """GPU: sleep level 1 (weights to host memory, KV cache dropped) so training can use the GPU. CPU: nothing."""
        if self.on_gpu and not self.asleep:
            self.llm.reset_prefix_cache()
            self.llm.sleep(level=1)
            self.asleep = True

    def invalidate_kv_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    # ------------------------------------------------------------------ refit
    def prepare_refit_info(self, state_dict_info: Mapping[str, tuple[Any, torch.dtype]]) -> None:
        """Record what the trainer will send (``{name: (shape, dtype)}``) and check it covers this model."""
        specs = specs_from_info(state_dict_info)
        if self.checkpoint_specs is not None:
            offered = self._with_tied_head({s.name: s for s in specs})
            mismatch = describe_spec_mismatch(self.checkpoint_specs, offered.values(), dtypes=False)
            if mismatch:
                raise RefitError(f"engine rank {self.rank}: the trainer's weights do not fit this model: {mismatch}")
        self.refit_specs = specs

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor] | PackedTensors) -> None:
        """Load a full Hugging Face-named state dict, plain or packed (colocated refit). Raises `RefitError`
        without touching the engine when names or shapes differ from what it expects."""
        state = unpack_tensors(state_dict) if isinstance(state_dict, PackedTensors) else dict(state_dict)
        self._load_checked(state, source="state dict")

    def init_collective(
        self, master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float = 300.0
    ) -> None:
        """Join the weight-transfer group (rank 0: train rank 0; engines: ranks 1..)."""
        device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")
        self.transfer_group = WeightTransferGroup(master_address, master_port, rank, world_size, device, timeout_s)

    def update_weights_from_collective(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Receive the weights broadcast by train rank 0 into fresh buffers, then load them (non-colocated refit)."""
        if self.transfer_group is None:
            raise RefitError(f"engine rank {self.rank}: init_collective was not called before a collective refit")
        if self.refit_specs is None:
            raise RefitError(f"engine rank {self.rank}: prepare_refit_info was not called before a collective refit")
        try:
            received = receive_state_dict(self.transfer_group, self.refit_specs, src=0, bucket_bytes=bucket_bytes)
        except WeightTransferError as error:
            raise RefitError(f"engine rank {self.rank}: refit aborted, previous weights kept: {error}") from error
        self._load_checked(received, source="collective broadcast")

    def _load_checked(self, state: dict[str, torch.Tensor], source: str) -> None:
        self._check_serving()
        state = self._with_tied_head(state)
        expected = self.checkpoint_specs or self.refit_specs
        if expected is None:
            raise RefitError(f"engine rank {self.rank}: call prepare_refit_info first (the model folder is unknown)")
        got = [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in state.items()]
        mismatch = describe_spec_mismatch(expected, got, dtypes=False)
        if mismatch:
            raise RefitError(f"engine rank {self.rank}: {source} refused, previous weights kept: {mismatch}")
        with self._load_turn():
            try:
                if self.is_async:  # across the engine core's process boundary: raw bytes (engine_extension.py)
                    self.llm.load_weights(pack_for_engine_core(state))
                else:
                    self.llm.collective_rpc("load_weights_in_place", kwargs={"weights": list(state.items())})
            except Exception as error:
                # vLLM reloads layer by layer: a failure here can leave some layers updated. Refuse to serve.
                self.broken = f"{type(error).__name__}: {error}"
                raise RuntimeError(
                    f"engine rank {self.rank}: loading checked weights failed half-way ({self.broken}); this engine "
                    "no longer serves requests, restart the generation worker group"
                ) from error
            if self.llm.llm_engine.has_unfinished_requests():
                self.in_flight_loads += 1
            # KV blocks computed with the old weights must never be reused; with requests running the reset fails
            # and is retried as soon as none runs.
            self._prefix_cache_stale = True
            self._reset_stale_prefix_cache()

    def _with_tied_head(self, items: dict[str, Any]) -> dict[str, Any]:
        """Add ``lm_head.weight`` (a tensor or a spec) from the embedding for tied models: vLLM keeps the OLD head
        on a reload without it, even when the head is tied."""
        if self.tied_head and TIED_HEAD not in items and EMBEDDING in items:
            head = items[EMBEDDING]
            items = {**items, TIED_HEAD: replace(head, name=TIED_HEAD) if isinstance(head, TensorSpec) else head}
        return items

    def _check_serving(self) -> None:
        if self.broken is not None:
            raise RuntimeError(f"engine rank {self.rank} is unusable after a failed weight load: {self.broken}")

    # ------------------------------------------------------------------ lifecycle
    def shm_segments(self) -> list[str]:
        """The ``/dev/shm`` segments this engine's processes hold now (all made when it started), for the driver's
        reaper: a SIGKILL of the driver gives `shutdown` no chance to remove them."""
        return sorted(engine_io.shm_files_mapped_by_process_tree())

    def shutdown(self) -> bool:
        """Delete this worker's temp dir and ``/dev/shm`` leftovers before the group kills it.

        The sync engine is not shut down: it runs in this process, and the kill that follows frees everything it
        holds — its own shutdown would only spend ~1.3 s of CPU tidying memory about to go (the worker processes of
        its tensor/pipeline ranks are killed). The async engine's core process is stopped."""
        shm_files = engine_io.shm_files_mapped_by_process_tree()
        if self.is_async:  # its engine core is a child process, which the kill of this actor would orphan
            self.llm.shutdown()
        elif self.cfg.vllm_cfg.devices_per_engine > 1:
            # The ranks' processes would notice this actor's end only after it: stopped now, as the kill would.
            _kill_child_processes()
        if self.transfer_group is not None:
            self.transfer_group.destroy()
            self.transfer_group = None
        for path in shm_files:
            Path(path).unlink(missing_ok=True)
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        return True


def _join_pipeline_stages(per_rank: list[list[torch.Tensor]], tensor_parallel_size: int) -> list[torch.Tensor]:
    """One ``[positions, layers, k]`` record per request from every engine rank's: tensor-parallel ranks route alike
    (the router runs whole on each), pipeline stages each hold their own layers (ranks are stage-major)."""
    stages = per_rank[::tensor_parallel_size]
    return [torch.cat(records, dim=1) for records in zip(*stages, strict=True)]


def _kill_child_processes() -> None:
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def _peak_rss_of(pid: int) -> int:
    """Peak resident memory of a live process (``VmHWM``), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def _use_private_tmp_dir(tmp_dir: str) -> str:
    """Point this process's temp dir (and vLLM's IPC path) at ``tmp_dir`` before vLLM reads them."""
    os.makedirs(tmp_dir, exist_ok=True)
    os.environ["TMPDIR"] = tmp_dir
    os.environ["VLLM_RPC_BASE_PATH"] = tmp_dir
    tempfile.tempdir = tmp_dir
    return tmp_dir
