"""An OpenAI-compatible HTTP server on a generation worker's async engine (``vllm_cfg.expose_http_server: true``).

vLLM's own server pieces do the serving (`build_app` + `init_app_state`: ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``, chat templates, tool-call parsing, a 404 for a model name it does not serve);
this module adds what RL needs on top:

- **Recording.** Every call that comes in over HTTP is recorded with the exact token ids the engine saw and sampled
  and the processed logprob of each sampled token (the distribution the trainer recomputes), whatever the client
  asked for: logprobs are switched on in the engine's request only, so the response keeps the client's choice.
- **Episodes.** A request's ``X-Episode-Id`` header names the agent episode it belongs to; its records are taken
  by that id (`take_calls`). Calls without the header are served and not kept.
- **Weight versions.** Each recorded token carries the number of weight updates the engine had loaded when it was
  sampled (vLLM's per-token version spans, labelled by `AsyncEngine.load_weights`), so the tokens of a call that
  spans a refit are told apart.

The server runs on the async engine's event loop (the requests' coroutines and the engine's are one loop), bound to
the run's own address on a port the operating system picks.
"""

from __future__ import annotations

import contextvars
import socket
from collections import defaultdict
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from nemo_rl_clone.contract.episode import EPISODE_HEADER, ServedCall
from nemo_rl_clone.models.generation.config import HTTP_CHAT_KWARG_FLAGS

_episode: contextvars.ContextVar[str | None] = contextvars.ContextVar("served_episode", default=None)


class RecordingAsyncLLM(AsyncLLM):
    """vLLM's async engine that records the calls made over HTTP with an episode (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served_calls: dict[str, list[ServedCall]] = defaultdict(list)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        episode = _episode.get()
        if not episode:  # the worker's own batches, or an HTTP call that named no episode: nothing to join it to
            async for output in super().generate(prompt, sampling_params, request_id, **kwargs):
                yield output
            return
        if sampling_params.logprobs is None:
            sampling_params = sampling_params.clone()
            sampling_params.logprobs = 0  # the sampled token's own logprob; the response follows the request
        delta = sampling_params.output_kind == RequestOutputKind.DELTA
        prompt_ids: list[int] = []
        tokens: dict[int, list[int]] = defaultdict(list)
        logprobs: dict[int, list[float]] = defaultdict(list)
        versions: dict[int, tuple[int, ...]] = {}
        async for output in super().generate(prompt, sampling_params, request_id, **kwargs):
            prompt_ids = list(output.prompt_token_ids or prompt_ids)
            for completion in output.outputs:
                if completion.weight_versions is not None:  # the final output's spans, over all its tokens
                    versions[completion.index] = token_versions(completion.weight_versions)
                new_tokens = list(completion.token_ids)
                steps: Any = completion.logprobs or []  # one {token id: Logprob} per token (logprobs >= 0)
                new_logprobs = [step[token].logprob for step, token in zip(steps, new_tokens, strict=True)]
                if not delta:  # cumulative or final: each output holds everything so far
                    tokens[completion.index], logprobs[completion.index] = [], []
                tokens[completion.index] += new_tokens
                logprobs[completion.index] += new_logprobs
            yield output
        for index in sorted(tokens):
            self.served_calls[episode].append(
                ServedCall(tuple(prompt_ids), tuple(tokens[index]), tuple(logprobs[index]), versions.get(index))
            )

    def take_calls(self, episode_id: str) -> list[ServedCall]:
        """The episode's calls in the order they finished, forgotten once taken."""
        return self.served_calls.pop(episode_id, [])


def token_versions(spans: list[Any]) -> tuple[int, ...]:
    """One weight version per output token from vLLM's ``WeightVersionSpan`` list (version label, start, end);
    vLLM's label before the first load is "default": version 0."""
    versions: list[int] = []
    for span in spans:
        versions += [0 if span.version == "default" else int(span.version)] * (span.end - span.start)
    return tuple(versions)


class EpisodeMiddleware:
    """Pure ASGI: the request's ``X-Episode-Id`` becomes the episode of the engine calls its handler makes (a
    context variable, which the handler's coroutines and the streamed body see)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers", ())).get(EPISODE_HEADER.lower().encode())
        token = _episode.set(header.decode() if header else None)
        try:
            await self.app(scope, receive, send)
        finally:
            _episode.reset(token)


def server_args(
    model_path: str, served_model_name: str, chat_kwargs: Mapping[str, Any], api_key: str | None = None
) -> Any:
    """vLLM's server arguments, parsed by its own parser (its defaults for everything not set here). With
    ``api_key``, vLLM's own check answers 401 to a ``/v1`` request without that bearer token."""
    import json

    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model_path, "--served-model-name", served_model_name, "--disable-log-stats"]
    argv += ["--disable-fastapi-docs", "--disable-uvicorn-access-log"]
    argv += ["--api-key", api_key] if api_key else []
    for key, value in chat_kwargs.items():
        flag = HTTP_CHAT_KWARG_FLAGS[key]  # the config check refuses other keys
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, json.dumps(dict(value)) if isinstance(value, Mapping) else str(value)]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


class OpenAIServer:
    """The HTTP server of one engine; `start` runs on the engine's loop and returns the base URL (``.../v1``)."""

    def __init__(self, engine: RecordingAsyncLLM, model_path: str, served_model_name: str, host: str) -> None:
        self.engine = engine
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.host = host
        self.url = ""
        self._server: Any = None
        self._task: Any = None

    async def start(self, chat_kwargs: Mapping[str, Any], api_key: str | None = None) -> str:
        import asyncio

        import uvicorn
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app

        args = server_args(self.model_path, self.served_model_name, chat_kwargs, api_key)
        tasks = await self.engine.get_supported_tasks()
        app = build_app(args, tasks, self.engine.model_config)
        await init_app_state(self.engine, app.state, args, tasks)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, 0))  # the port is picked and held at once: no other process can take it meanwhile
        config = uvicorn.Config(EpisodeMiddleware(app), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # the server's own error
            await asyncio.sleep(0.01)
        self.url = f"http://{self.host}:{sock.getsockname()[1]}/v1"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True  # no wait for requests in flight: the engine stops next and ends them
            await self._task
            self._server = None
