"""One OpenAI-compatible URL in front of every engine's HTTP server (``vllm_cfg.expose_http_server``).

A Ray actor that forwards each request, body and streamed response byte for byte, to one engine's server:

- **Episodes stay on one engine.** The first request of an ``X-Episode-Id`` goes to the engine with the fewest
  episodes open (then the fewest requests in flight), and every later request of that episode follows it: the
  engine's prefix cache holds the episode's context, and its records hold all of its calls.
  `VllmGeneration.take_served_calls` closes the episodes it takes.
- **Other requests** go to the engine with the fewest requests in flight.
- An engine that cannot be reached answers 502 with one line naming it; the router keeps serving.
- **With an API key** (the run's, `VllmGeneration.api_key`) a request without that bearer token is answered 401
  by vLLM's own check, before it reaches an engine; the token is forwarded, and each engine checks it too.

Requests are not retried: a retried request may have been served (and recorded) already.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

from nemo_rl_clone.contract.episode import EPISODE_HEADER

# Not forwarded: they describe one connection, not the request (httpx and uvicorn set their own).
_HOP_HEADERS = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"})


class EpisodeRouter:
    """A Ray async actor (its methods and the server share the actor's event loop). ``engine_urls``: the engines'
    base URLs (``http://host:port/v1``), in engine order; ``api_key``: the bearer token requests must carry."""

    def __init__(self, engine_urls: Sequence[str], api_key: str | None = None) -> None:
        self.api_key = api_key
        self.roots = [url.removesuffix("/").removesuffix("/v1") for url in engine_urls]
        self.in_flight = [0] * len(self.roots)
        self.episode_engine: dict[str, int] = {}
        self.open_episodes = [0] * len(self.roots)
        self.routed = [0] * len(self.roots)  # requests sent to each engine, ever
        self._server: Any = None  # uvicorn's; the router stops when its actor is killed
        self._task: Any = None
        self._client: Any = None

    async def start(self) -> str:
        """Serve on this node's address, on a port the operating system picks; the router's base URL."""
        import httpx
        import ray
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        middleware = []
        if self.api_key:
            from starlette.middleware import Middleware
            from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

            middleware.append(Middleware(AuthenticationMiddleware, tokens=[self.api_key]))
        app = Starlette(routes=[Route("/{path:path}", self._forward, methods=methods)], middleware=middleware)
        # No pool limit or timeout of the router's own: the agent's client owns both.
        self._client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=None))
        host = ray.util.get_node_ip_address()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))  # a reference kept
        while not self._server.started:
            if self._task.done():
                self._task.result()  # the server's own error
            await asyncio.sleep(0.01)
        return f"http://{host}:{sock.getsockname()[1]}/v1"

    def choose(self, episode: str | None) -> int:
        """The engine for a request of ``episode`` (None: a request outside any episode)."""
        engines = range(len(self.roots))
        if episode is None:
            return min(engines, key=lambda e: (self.in_flight[e], self.routed[e]))
        engine = self.episode_engine.get(episode)
        if engine is None:
            engine = min(engines, key=lambda e: (self.open_episodes[e], self.in_flight[e], self.routed[e]))
            self.episode_engine[episode] = engine
            self.open_episodes[engine] += 1
        return engine

    def close_episodes(self, episode_ids: Sequence[str]) -> None:
        """Forget these episodes (their records were taken): a later request with the id starts afresh."""
        for episode in episode_ids:
            engine = self.episode_engine.pop(episode, None)
            if engine is not None:
                self.open_episodes[engine] -= 1

    def stats(self) -> dict[str, list[int]]:
        """Requests routed to each engine so far, and episodes open on each."""
        return {"routed": list(self.routed), "open_episodes": list(self.open_episodes)}

    async def _forward(self, request: Any) -> Any:
        import httpx
        from starlette.responses import JSONResponse, StreamingResponse

        engine = self.choose(request.headers.get(EPISODE_HEADER))
        self.routed[engine] += 1
        self.in_flight[engine] += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        url = f"{self.roots[engine]}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        upstream = self._client.build_request(request.method, url, headers=headers, content=await request.body())
        try:
            response = await self._client.send(upstream, stream=True)
        except httpx.HTTPError as error:
            self.in_flight[engine] -= 1
            message = f"router: engine {engine} ({self.roots[engine]}) unreachable: {type(error).__name__}: {error}"
            return JSONResponse({"error": {"message": message, "type": "BadGateway", "code": 502}}, status_code=502)

        async def body() -> Any:
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:  # also when the client went away: closing the upstream stream makes vLLM abort the request
                await response.aclose()
                self.in_flight[engine] -= 1

        kept = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS}
        return StreamingResponse(body(), status_code=response.status_code, headers=kept)
