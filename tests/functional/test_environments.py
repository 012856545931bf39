"""GRPO runs on other environments: the multi-turn sliding puzzle, tool use, code in the sandbox, a reward model, a
user's own environment named only in YAML, and a multi-turn environment served over HTTP."""

from __future__ import annotations

import json
import os
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.functional.supervised_runs import (
    REPO,
    entry_point_args,
    read_metrics,
    run_entry_point,
    run_script,
    shared_ray_env,
)


@pytest.mark.xdist_group("memory")  # SmolLM2 in a policy and an engine
def test_sliding_puzzle_smoke_plays_several_turns_with_exact_tokens(tmp_path: Path) -> None:
    run_entry_point("grpo_sliding_puzzle", tmp_path, config="grpo_sliding_puzzle_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        assert m["train/rollout/mean_turns"] > 1, m  # the game goes on after the first move
        # Observations are appended as tokens and never re-tokenised: the trainer scores exactly what was sampled.
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01, m
    assert "validation/accuracy" in metrics[2]
    assert "train/rollout/env/sliding_puzzle_game/solve_rate" in metrics[1]
    samples = [json.loads(line) for line in (run_dir / "train_data_step1.jsonl").read_text().splitlines()]
    later_turns = [s for s in samples if "Tiles you can move" in s["response"]]
    assert later_turns, [s["response"] for s in samples]
    assert "<|im_start|>user\n" in later_turns[0]["response"]  # the board came back as a templated user turn


USER_ENVIRONMENT = '''
"""A user's environment: rewards answers by how close their length is to a target (a whole episode per step)."""

import json
import os
from dataclasses import dataclass

import torch

from nemo_rl_clone.environments.interfaces import EnvironmentInterface, EnvironmentReturn, last_assistant_text


@dataclass
class LengthConfig:
    target_chars: int = 40
    log_file: str = ""

    def check(self):
        return [] if self.target_chars > 0 else [("target_chars", "must be > 0")]


class LengthReward(EnvironmentInterface):
    config_class = LengthConfig

    def __init__(self, cfg):
        self.cfg = cfg

    def step(self, message_log_batch, metadata):
        texts = [last_assistant_text(log, i) for i, log in enumerate(message_log_batch)]
        target = self.cfg.target_chars
        rewards = [max(0.0, 1.0 - abs(len(text) - target) / target) for text in texts]
        with open(self.cfg.log_file, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "rewards": rewards}) + "\\n")
        n = len(texts)
        # A reply longer than the room a 96-token conversation has left: the rollout must cut it and end the sample.
        return EnvironmentReturn(
            observations=[{"role": "user", "content": "Please say more. " * 40}] * n,
            metadata=metadata,
            next_stop_strings=[None] * n,
            rewards=torch.tensor(rewards),
            terminateds=torch.zeros(n, dtype=torch.bool),
            answers=[None] * n,
        )

    def global_post_process_and_metrics(self, batch):
        return batch, {}
'''


def test_users_own_environment_named_only_in_yaml(tmp_path: Path) -> None:
    package = tmp_path / "user_code" / "my_envs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "length.py").write_text(textwrap.dedent(USER_ENVIRONMENT))
    calls = tmp_path / "calls.jsonl"
    config = tmp_path / "length_reward.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            defaults: {REPO / "configs" / "grpo_smoke.yaml"}
            grpo:
              max_rollout_turns: 2
            policy:
              generation:
                stop_strings: ["e"]  # the random model's turn ends early (a truncated turn gets no observation)
            data:
              env_name: length_reward  # every row goes to the environment below
            env:
              reasoning_gym: null
              length_reward:
                env_class: my_envs.length.LengthReward
                cfg:
                  target_chars: 80
                  log_file: {calls}
            """
        )
    )
    args = entry_point_args("grpo_math", tmp_path)
    args[args.index("--config") + 1] = str(config)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'user_code'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_script(args, tmp_path, env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert all(r["pid"] != os.getpid() for r in records)  # it ran as its own actor
    # 2 training steps of 4 prompts x 2 samples, and validation of 8 problems at step 2, all scored by it.
    assert sum(len(r["rewards"]) for r in records) == 2 * 8 + 8
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    step_rewards = [r for record in records for r in record["rewards"]]
    assert any(0.0 < r < 1.0 for r in step_rewards)  # graded by length, unlike the built-in 0/1 scorers
    assert 0.0 <= metrics[1]["train/reward"] <= 1.0
    # The environment's long reply is cut at policy.max_total_sequence_length (96), and the sample ends truncated.
    for step in (1, 2):
        assert metrics[step]["train/total_num_tokens"] == 8 * 96, metrics[step]
        assert metrics[step]["train/rollout/truncation_rate"] == 1.0


def test_code_environment_smoke_runs_responses_in_the_sandbox(tmp_path: Path) -> None:
    run_entry_point("grpo_math", tmp_path, config="grpo_code_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        # The tiny random model writes no working code, but every response ran in a sandbox and was scored.
        assert m["train/rollout/env/code/num_samples"] == 8, m
        assert m["train/rollout/env/code/accuracy"] == 0.0
        assert m["train/rollout/env/code/verifier_crashes"] == 0.0
    assert "validation/accuracy" in metrics[2]


def test_tool_use_smoke_scores_every_episode(tmp_path: Path) -> None:
    run_entry_point("grpo_math", tmp_path, config="grpo_tool_use_smoke.yaml")
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        assert m["train/rollout/env/tool_use/calls"] == 0.0, m  # random tokens are no tool call
        assert m["train/rollout/env/tool_use/mean_turns"] == 1.0
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01
    assert "validation/accuracy" in metrics[2]


class TwoTurnServer(BaseHTTPRequestHandler):
    """A user's environment server: answers an episode's first turn with a user message, ends it after the second
    and rewards the second answer by its length (so rewards differ within a group)."""

    requests: ClassVar[list[Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        TwoTurnServer.requests.append(payload)
        results = []
        for episode in payload["episodes"]:
            answers = [m["content"] for m in episode["messages"] if m["role"] == "assistant"]
            if len(answers) == 1:
                results.append(
                    {"reward": 0.0, "done": False, "observation": "Once more, please.", "stop_strings": [" "]}
                )
            else:
                results.append({"reward": min(len(answers[-1]), 40) / 40, "done": True})
        body = json.dumps({"results": results}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_grpo_with_a_remote_multi_turn_environment(tmp_path: Path) -> None:
    """Every episode is two turns driven by an HTTP server the test starts: the first answer gets a user reply from
    the server, the second ends the episode. Generation stops at a space, which the random model writes early, so
    no turn is cut by the token limit."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), TwoTurnServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/step"
        config = tmp_path / "remote.yaml"
        config.write_text(
            textwrap.dedent(
                f"""\
                defaults: {REPO / "configs" / "grpo_smoke.yaml"}
                grpo: {{max_rollout_turns: 2}}
                policy:
                  max_total_sequence_length: 160
                  generation:
                    stop_strings: [" "]
                    vllm_cfg: {{max_model_len: 160}}
                data: {{env_name: my_gym}}
                env:
                  reasoning_gym: null
                  my_gym:
                    env_class: nemo_rl_clone.environments.remote_environment.RemoteEnvironment
                    cfg: {{url: "{url}", timeout_s: 30}}
                """
            )
        )
        args = entry_point_args("grpo_math", tmp_path)
        args[args.index("--config") + 1] = str(config)
        proc = run_script(args, tmp_path, shared_ray_env(), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    finally:
        httpd.shutdown()
        thread.join()
    (run_dir,) = (tmp_path / "logs").iterdir()
    metrics = read_metrics(run_dir)
    for step in (1, 2):
        m = metrics[step]
        assert m["train/rollout/mean_turns"] == 2.0, m
        assert 1.0 <= m["train/token_mult_prob_error"] <= 1.01  # the server's replies were appended as tokens
        assert m["train/rollout/env/my_gym/requests"] == 2.0  # one request per turn, for the whole batch
    second_turns = [r for r in TwoTurnServer.requests if len(r["episodes"][0]["messages"]) > 2]
    assert second_turns and "Once more, please." in second_turns[0]["episodes"][0]["messages"][-2]["content"]
    samples = [json.loads(line) for line in (run_dir / "train_data_step1.jsonl").read_text().splitlines()]
    assert all("<|im_start|>user\nOnce more, please.<|im_end|>" in s["response"] for s in samples)
