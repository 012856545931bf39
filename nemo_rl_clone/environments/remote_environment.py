"""`RemoteEnvironment`: an environment that lives in the user's own HTTP server (NeMo-Gym style).

Each `step` POSTs the batch's episodes to ``cfg.url`` as JSON and reads back one result per episode::

    request:  {"episodes": [{"messages": [{"role": str, "content": str}, ...], "metadata": {...}}, ...]}
    response: {"results": [{"reward": float, "done": bool,
                            "observation": str | {"role": "user" | "tool", "content": str} | null,
                            "metadata": {...} (optional: the episode's metadata for its next turn; default unchanged),
                            "stop_strings": [str] | null (optional), "answer": str | null (optional)}, ...]}

``observation`` is required where ``done`` is false (a string is a user message). Connection errors, timeouts and
HTTP 5xx answers are retried ``max_retries`` times with doubling backoff; a 4xx, a body that is not that JSON, or
``max_retries`` failures in a row stop the run with one `RemoteEnvironmentError` line naming the URL and the fault.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from nemo_rl_clone.environments.interfaces import EnvironmentInterface, EnvironmentReturn, check_step_batch
from nemo_rl_clone.utils.config_validation import check_at_least
from nemo_rl_clone.utils.errors import UserInputError


class RemoteEnvironmentError(UserInputError):
    """The environment server failed or answered something other than the protocol."""


@dataclass
class RemoteEnvConfig:
    """``url``: the endpoint each step POSTs to; ``timeout_s``: per request; ``headers``: e.g. authorization."""

    url: str = ""
    timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 1.0
    headers: dict[str, str] = field(default_factory=dict)

    def check(self) -> list[tuple[str, str]]:
        problems = check_at_least(self, 0, "max_retries", "retry_backoff_s")
        if not self.url.startswith(("http://", "https://")):
            problems.append(("url", f"must be an http:// or https:// URL, got {self.url!r}"))
        if self.timeout_s <= 0:
            problems.append(("timeout_s", f"must be > 0, got {self.timeout_s}"))
        return problems


class RemoteEnvironment(EnvironmentInterface):
    """Named in YAML as ``env.<name>.env_class: nemo_rl_clone.environments.remote_environment.RemoteEnvironment``
    with ``cfg: {url: ...}``; made a Ray actor by `create_env`."""

    config_class = RemoteEnvConfig

    def __init__(self, cfg: RemoteEnvConfig):
        self.cfg = cfg
        self.requests = 0  # HTTP requests sent, retries included
        self.retries = 0

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any]]) -> EnvironmentReturn:
        check_step_batch(message_log_batch, metadata)
        episodes = [
            {"messages": [{"role": m["role"], "content": m["content"]} for m in log], "metadata": dict(info)}
            for log, info in zip(message_log_batch, metadata, strict=True)
        ]
        answer = self._post({"episodes": episodes})
        results = answer.get("results") if isinstance(answer, Mapping) else None
        if not isinstance(results, list):
            self._fail(f"the answer must be a JSON object with a 'results' list, got {_short(answer)}")
        if len(results) != len(episodes):
            self._fail(f"returned {len(results)} results for {len(episodes)} episodes")
        parsed = [self._result(i, result, metadata[i]) for i, result in enumerate(results)]
        return EnvironmentReturn(
            observations=[p[0] for p in parsed],
            metadata=[p[1] for p in parsed],
            next_stop_strings=[p[2] for p in parsed],
            rewards=torch.tensor([p[3] for p in parsed], dtype=torch.float32),
            terminateds=torch.tensor([p[4] for p in parsed], dtype=torch.bool),
            answers=[p[5] for p in parsed],
        )

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Reads ``rewards`` [B]: mean reward, and the requests and retries sent since the previous call."""
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32)
        metrics = {"mean_reward": float(rewards.mean()) if len(rewards) else 0.0}
        metrics.update(requests=float(self.requests), retries=float(self.retries))
        self.requests = self.retries = 0
        return batch, metrics

    def _post(self, payload: Mapping[str, Any]) -> Any:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **self.cfg.headers}
        last = ""
        for attempt in range(self.cfg.max_retries + 1):
            if attempt:
                self.retries += 1
                time.sleep(self.cfg.retry_backoff_s * 2 ** (attempt - 1))
            self.requests += 1
            request = urllib.request.Request(self.cfg.url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                    text = response.read().decode("utf-8", errors="replace")
            except urllib.error.HTTPError as error:
                detail = error.read().decode("utf-8", errors="replace")[:200]
                last = f"HTTP {error.code}: {detail}"
                if error.code < 500:  # the request itself is wrong: a retry gets the same answer
                    self._fail(last)
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                reason = getattr(error, "reason", error)
                last = f"no answer within {self.cfg.timeout_s} s" if isinstance(reason, TimeoutError) else str(reason)
                continue
            try:
                return json.loads(text)
            except json.JSONDecodeError as error:
                self._fail(f"the answer is not JSON ({error.msg} at character {error.pos}): {text[:200]!r}")
        self._fail(f"no valid answer after {self.cfg.max_retries + 1} attempts; last: {last}")

    def _result(
        self, index: int, result: Any, metadata: Mapping[str, Any]
    ) -> tuple[dict[str, str], dict[str, Any], list[str] | None, float, bool, str | None]:
        if not isinstance(result, Mapping):
            self._fail(f"result {index} must be an object, got {_short(result)}")
        reward, done = result.get("reward"), result.get("done")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            self._fail(f"result {index}: 'reward' must be a finite number, got {_short(reward)}")
        if not isinstance(done, bool):
            self._fail(f"result {index}: 'done' must be true or false, got {_short(done)}")
        raw_observation = result.get("observation")
        observation = _observation(raw_observation)
        if raw_observation is not None and observation is None:
            self._fail(
                f'result {index}: \'observation\' must be a string or {{"role": "user" | "tool", "content": str}}, '
                f"got {_short(raw_observation)}"
            )
        if observation is None and not done:
            self._fail(f"result {index}: 'observation' is required when 'done' is false")
        new_metadata = result.get("metadata", metadata)
        if not isinstance(new_metadata, Mapping):
            self._fail(f"result {index}: 'metadata' must be an object, got {_short(new_metadata)}")
        stops = result.get("stop_strings")
        if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
            self._fail(f"result {index}: 'stop_strings' must be a list of strings or null, got {_short(stops)}")
        answer = result.get("answer")
        return (
            observation or {"role": "user", "content": ""},
            dict(new_metadata),
            stops,
            float(reward),
            done,
            None if answer is None else str(answer),
        )

    def _fail(self, message: str) -> NoReturn:
        raise RemoteEnvironmentError(f"remote environment {self.cfg.url}: {message}")


def _observation(value: Any) -> dict[str, str] | None:
    if isinstance(value, str):
        return {"role": "user", "content": value}
    if isinstance(value, Mapping) and value.get("role") in ("user", "tool") and isinstance(value.get("content"), str):
        return {"role": value["role"], "content": value["content"]}
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)  # values come from the server's JSON
    return text if len(text) <= 80 else text[:77] + "..."
