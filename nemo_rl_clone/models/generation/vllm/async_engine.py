"""vLLM's async engine (``policy.generation.vllm_cfg.async_engine: true``) behind the part of ``vllm.LLM`` that
`VllmGenerationWorker` uses, so the worker's generation, refit and cache handling stay one code path.

``AsyncLLM`` runs its engine core in a child process (vLLM has no in-process asyncio engine) and schedules requests
as they arrive (continuous batching): a batch is submitted request by request and gathered. Its coroutines run on an
event loop of this object's own thread; the worker's synchronous (Ray) methods wait on them. Weight loads go to the
engine core as a utility call, which it runs between two engine steps: a load issued while a batch generates lands
between its steps with no step-by-step driving (the in-flight weight updates of async GRPO), and the tokens sampled
after it carry the new weight version (`load_weights`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
ENGINE_CORE_EXIT_S = 1.0  # how long shutdown waits for the engine core to exit before killing it


class AsyncEngine:
    """One ``vllm.v1.engine.async_llm.AsyncLLM`` built from ``engine_kwargs`` (``vllm.EngineArgs`` fields)."""

    def __init__(self, engine_kwargs: dict[str, Any]) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the async engine exists only with its core in a child
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async-engine", daemon=True)
        self._thread.start()
        self._ids = itertools.count()
        self.server: Any = None
        self._running = 0  # requests submitted and not finished (read from other threads: a plain int is enough)
        self.weight_version = 0  # weight loads so far; vLLM labels tokens with it (its initial label is "default")
        self.engine: Any = self._wait(self._create(engine_kwargs))

    @staticmethod
    async def _create(engine_kwargs: dict[str, Any]) -> Any:
        # Built on the loop that will drive it: its output handler is a task of the running loop.
        from vllm.engine.arg_utils import AsyncEngineArgs

        from nemo_rl_clone.models.generation.vllm.http_server import RecordingAsyncLLM

        return RecordingAsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))

    def _wait(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # ------------------------------------------------------------------ the `vllm.LLM` subset the worker uses
    @property
    def llm_engine(self) -> AsyncEngine:
        return self  # `LLM.llm_engine.model_config` / `.has_unfinished_requests()`

    @property
    def model_config(self) -> Any:
        return self.engine.model_config

    def has_unfinished_requests(self) -> bool:
        # The engine's own count: the HTTP server's requests as well as this object's batches.
        return self._running > 0 or self.engine.output_processor.has_unfinished_requests()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Sequence[Any], params: Sequence[Any], use_tqdm: bool = False) -> list[Any]:
        """Every prompt's final ``RequestOutput``, in prompt order (as ``LLM.generate`` returns them)."""
        del use_tqdm  # no progress bar for requests that arrive one by one
        return self._wait(self._generate_all(prompts, params))

    async def _generate_all(self, prompts: Sequence[Any], params: Sequence[Any]) -> list[Any]:
        return list(await asyncio.gather(*(self._generate_one(p, sp) for p, sp in zip(prompts, params, strict=True))))

    async def _generate_one(self, prompt: Any, params: Any) -> Any:
        from vllm.sampling_params import RequestOutputKind

        params = params.clone()
        params.output_kind = RequestOutputKind.FINAL_ONLY  # the whole output once, as `LLM.generate` gives it
        final = None
        self._running += 1
        try:
            async for output in self.engine.generate(prompt, params, str(next(self._ids))):
                final = output
        finally:
            self._running -= 1
        return final

    def collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> Any:
        return self._wait(self.engine.collective_rpc(method, kwargs=kwargs))

    def reset_prefix_cache(self) -> bool:
        return bool(self._wait(self.engine.reset_prefix_cache()))

    def sleep(self, level: int = 1) -> None:
        self._wait(self.engine.sleep(level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._wait(self.engine.wake_up(tags))

    # ------------------------------------------------------------------ the HTTP server (http_server.py)
    def serve_openai(
        self, model_path: str, served_model_name: str, host: str, chat_kwargs: dict[str, Any], api_key: str | None
    ) -> str:
        """Start the OpenAI-compatible server on this engine (requests must carry ``api_key``, when given, as a
        bearer token); its base URL."""
        from nemo_rl_clone.models.generation.vllm.http_server import OpenAIServer

        self.server = OpenAIServer(self.engine, model_path, served_model_name, host)
        return self._wait(self.server.start(chat_kwargs, api_key))

    def take_served_calls(self, episode_ids: list[str]) -> dict[str, list[Any]]:
        """The `ServedCall` records of these episodes' HTTP calls, for those this engine served (taken on the loop,
        where records are appended)."""
        return self._wait(self._take(episode_ids))

    async def _take(self, episode_ids: list[str]) -> dict[str, list[Any]]:
        taken = {episode_id: self.engine.take_calls(episode_id) for episode_id in episode_ids}
        return {episode_id: calls for episode_id, calls in taken.items() if calls}

    def load_weights(self, rows: list[Any]) -> None:
        """Load `pack_for_engine_core` rows between two engine steps and label every token sampled after them with
        the next weight version (vLLM reports each token's version: `CompletionOutput.weight_versions`).

        The scheduler is paused with its requests kept (their KV blocks stay; they resume where they were), so no
        step runs between the load and the label: a token is never labelled with weights that did not sample it."""
        self._wait(self._load(rows))

    async def _load(self, rows: list[Any]) -> None:
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        try:
            await self.engine.collective_rpc("load_packed_weights", kwargs={"rows": rows})
            self.weight_version += 1
            await self.engine.update_weight_version(str(self.weight_version))
        finally:
            await self.engine.resume_generation()

    def engine_core_pids(self) -> list[int]:
        """Process ids of every descendant of this process, for their peak memory: the engine core and its worker
        (which holds the model), and any compiler the worker runs at that moment."""
        import psutil

        return [child.pid for child in psutil.Process().children(recursive=True)]

    def shutdown(self) -> None:
        """Stop the engine core process and this object's loop."""
        self._wait(self._shutdown())  # on the loop: it cancels the engine's output handler, a task of that loop
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _shutdown(self) -> None:
        if self.server is not None:
            await self.server.stop()
        # vLLM's own teardown of an engine core takes ~3 s on CPU, idle (it waits for its executor's worker) or busy
        # (a loaded core is slow to read its input); a stop must stay within Ctrl-C's bound, so the core is killed
        # after this (its shared memory is removed by the worker's shutdown).
        self.engine.shutdown(timeout=ENGINE_CORE_EXIT_S)
        # Dropped now (its HTTP app holds it too): collected later, its __del__ would shut down again and fail
        # once the interpreter exits.
        self.engine = self.server = None
