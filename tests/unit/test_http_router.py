"""`EpisodeRouter` in this process (no Ray actor): which engine each request goes to, and the 502 of an engine
that cannot be reached. Forwarding to real engines is tested in tests/unit/test_vllm_refit.py."""

from __future__ import annotations

import asyncio
import socket

import httpx

from nemo_rl_clone.models.generation.vllm.http_router import EpisodeRouter


def test_episodes_stick_to_the_engine_with_the_fewest_open_episodes() -> None:
    router = EpisodeRouter(["http://a:1/v1", "http://b:2/v1", "http://c:3/v1"])
    assert router.roots == ["http://a:1", "http://b:2", "http://c:3"]
    assert [router.choose(f"e{i}") for i in range(3)] == [0, 1, 2]  # one open episode each
    router.in_flight = [0, 5, 5]
    assert router.choose("e3") == 0 and router.choose("e1") == 1  # a known episode stays where it is
    router.close_episodes(["e0", "e3", "unknown"])
    assert router.open_episodes == [0, 1, 1] and router.choose("e0") == 0  # a closed id starts afresh
    router.in_flight, router.routed = [2, 1, 1], [9, 9, 3]
    assert router.choose(None) == 2  # no episode: fewest in flight, then fewest routed


def test_an_unreachable_engine_is_a_502_naming_it() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"

    async def ask() -> httpx.Response:
        router = EpisodeRouter([dead])
        url = await router.start()
        try:
            async with httpx.AsyncClient() as client:
                return await client.post(f"{url}/completions", json={"prompt": "hi"}, headers={"X-Episode-Id": "e"})
        finally:
            router._server.should_exit = True
            await router._task

    response = asyncio.run(ask())
    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert message.startswith(f"router: engine 0 ({dead.removesuffix('/v1')}) unreachable: ConnectError")
