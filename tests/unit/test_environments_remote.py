"""`RemoteEnvironment` against a real HTTP server on 127.0.0.1 that the tests start and stop: the protocol, retries,
timeouts, and one clear error for each way a server can misbehave."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
import ray

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.environments import create_env
from nemo_rl_clone.environments.remote_environment import RemoteEnvConfig, RemoteEnvironment, RemoteEnvironmentError
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.errors import find_user_input_error


class GameServer(BaseHTTPRequestHandler):
    """Path = behaviour. ``/game``: a guessing game (42 wins; otherwise "higher" / "lower" and play on)."""

    calls: ClassVar[dict[str, int]] = {}
    bodies: ClassVar[list[Any]] = []

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        GameServer.bodies.append({"path": self.path, "payload": payload, "auth": self.headers.get("Authorization")})
        count = GameServer.calls[self.path] = GameServer.calls.get(self.path, 0) + 1
        episodes = payload["episodes"]
        if (self.path == "/flaky" and count <= 2) or self.path == "/down":
            return self._send(500, "overloaded")
        if self.path == "/bad_request":
            return self._send(400, "unknown game 'chess'")
        if self.path == "/hang":
            time.sleep(1.5)
        if self.path == "/bad_json":
            return self._send(200, "<html>oops</html>")
        results = [self._play(e) for e in episodes]
        if self.path == "/wrong_length":
            results = results[:-1]
        if self.path == "/no_done":
            results[0].pop("done")
        if self.path == "/bad_observation":
            results[0] = {"reward": 0.0, "done": False, "observation": {"role": "assistant", "content": "x"}}
        return self._send(200, json.dumps({"results": results}))

    @staticmethod
    def _play(episode: dict[str, Any]) -> dict[str, Any]:
        guess = int(episode["messages"][-1]["content"])
        tries = episode["metadata"].get("tries", 0) + 1
        if guess == 42:
            return {"reward": 1.0, "done": True, "answer": str(guess)}
        hint = "higher" if guess < 42 else "lower"
        return {
            "reward": 0.0,
            "done": False,
            "observation": {"role": "tool", "content": hint} if tries > 1 else hint,
            "metadata": {"tries": tries},
            "stop_strings": ["\n"],
            "answer": str(guess),
        }

    def _send(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), GameServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def env(url: str, **kwargs: Any) -> RemoteEnvironment:
    return RemoteEnvironment(RemoteEnvConfig(url=url, retry_backoff_s=0.05, **kwargs))


def guesses(*numbers: int) -> tuple[list[list[dict[str, str]]], list[dict[str, Any]]]:
    logs = [[{"role": "user", "content": "Guess"}, {"role": "assistant", "content": str(n)}] for n in numbers]
    return logs, [{} for _ in numbers]


def test_protocol_round_trip_over_several_turns(server: str) -> None:
    game = env(f"{server}/game", headers={"Authorization": "Bearer t0ken"})
    result = game.step(*guesses(42, 7, 99))
    assert result.rewards.tolist() == [1.0, 0.0, 0.0] and result.terminateds.tolist() == [True, False, False]
    assert result.observations[1:] == [{"role": "user", "content": "higher"}, {"role": "user", "content": "lower"}]
    assert result.metadata[1] == {"tries": 1} and result.metadata[0] == {}  # metadata omitted: kept as sent
    assert result.next_stop_strings == [None, ["\n"], ["\n"]] and result.answers == ["42", "7", "99"]
    sent = GameServer.bodies[-1]
    assert sent["auth"] == "Bearer t0ken"
    assert sent["payload"]["episodes"][1] == {
        "messages": [{"role": "user", "content": "Guess"}, {"role": "assistant", "content": "7"}],
        "metadata": {},
    }
    # Second turn: the episode's metadata travels back, and the server may answer as a tool message.
    logs, _ = guesses(50)
    second = game.step(logs, [result.metadata[1]])
    assert second.observations == [{"role": "tool", "content": "lower"}] and second.metadata == [{"tries": 2}]
    _, metrics = game.global_post_process_and_metrics({"rewards": result.rewards})
    assert metrics == {"mean_reward": pytest.approx(1 / 3), "requests": 2.0, "retries": 0.0}


def test_server_errors_are_retried_with_backoff(server: str) -> None:
    flaky = env(f"{server}/flaky", max_retries=2)
    started = time.monotonic()
    assert flaky.step(*guesses(42)).rewards.tolist() == [1.0]  # two 500s, then an answer
    assert time.monotonic() - started >= 0.05 + 0.1  # backoff 0.05 s, then doubled
    assert (flaky.requests, flaky.retries) == (3, 2)


@pytest.mark.parametrize(
    ("path", "kwargs", "message"),
    [
        ("/down", {"max_retries": 1}, "no valid answer after 2 attempts; last: HTTP 500: overloaded"),
        (
            "/hang",
            {"timeout_s": 0.3, "max_retries": 1},
            "no valid answer after 2 attempts; last: no answer within 0.3 s",
        ),
        ("/bad_request", {}, "HTTP 400: unknown game 'chess'"),
        ("/bad_json", {}, "the answer is not JSON (Expecting value at character 0): '<html>oops</html>'"),
        ("/wrong_length", {}, "returned 1 results for 2 episodes"),
        ("/no_done", {}, "result 0: 'done' must be true or false, got null"),
        ("/bad_observation", {}, 'result 0: \'observation\' must be a string or {"role": "user" | "tool"'),
    ],
)
def test_misbehaving_servers_give_one_clear_error(server: str, path: str, kwargs: dict[str, Any], message: str) -> None:
    started = time.monotonic()
    with pytest.raises(RemoteEnvironmentError) as error:
        env(f"{server}{path}", **kwargs).step(*guesses(42, 7))
    assert str(error.value).startswith(f"remote environment {server}{path}: ")
    assert message in str(error.value)
    assert time.monotonic() - started < 5  # bounded: a hung server costs (retries + 1) x timeout_s


def test_unreachable_server(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    with pytest.raises(
        RemoteEnvironmentError, match=r"no valid answer after 1 attempts; last: .*[Cc]onnection refused"
    ):
        env(f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/game", max_retries=0).step(*guesses(1))


def test_config_is_validated_by_its_schema() -> None:
    section = {"env_class": "nemo_rl_clone.environments.remote_environment.RemoteEnvironment"}
    with pytest.raises(ConfigError) as error:
        validate_config(
            {"env": {"gym": {**section, "cfg": {"url": "localhost:8000", "timeout_s": 0}}}}, GRPOMasterConfig
        )
    assert error.value.problems == [
        "env.gym.cfg.url: must be an http:// or https:// URL, got 'localhost:8000'",
        "env.gym.cfg.timeout_s: must be > 0, got 0.0",
    ]


@pytest.mark.usefixtures("ray_local")
def test_as_a_ray_actor_named_in_yaml_its_errors_reach_the_driver_as_one_line(server: str) -> None:
    section = {"env_class": "nemo_rl_clone.environments.remote_environment.RemoteEnvironment"}
    config = validate_config(
        {
            "env": {
                "gym": {**section, "cfg": {"url": f"{server}/game"}},
                "down": {**section, "cfg": {"url": f"{server}/bad_request"}},
            },
            "data": {"env_name": "gym"},
        },
        GRPOMasterConfig,
    )
    gym, down = create_env("gym", config.env["gym"]), create_env("down", config.env["down"])
    assert ray.get(gym.step.remote(*guesses(42))).rewards.tolist() == [1.0]
    with pytest.raises(ray.exceptions.RayTaskError) as error:
        ray.get(down.step.remote(*guesses(42)))
    found = find_user_input_error(error.value)
    assert (
        found is not None and str(found) == f"remote environment {server}/bad_request: HTTP 400: unknown game 'chess'"
    )
    ray.kill(gym)
    ray.kill(down)
