"""What an actor's process pays to load its class: Ray imports the module that defines the class, and on two cores
every second of import in a verifier actor delays the policy and the engine starting beside it.

The verifier actors (one process per scorer, several per environment) score text: loading their modules must not
import torch (~3 s of CPU each here). Each check runs in a fresh interpreter, as a Ray worker does.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# The modules that define the classes `VerifierPool` runs as actors (each environment's scorer).
SCORER_MODULES = [
    "nemo_rl_clone.environments.reasoning_gym_environment",
    "nemo_rl_clone.environments.math_environment",
    "nemo_rl_clone.environments.code_environment",
    "nemo_rl_clone.environments.dapo_math_verifier",
]


@pytest.mark.parametrize("module", SCORER_MODULES)
def test_scorer_modules_load_without_torch(module: str) -> None:
    probe = f"import sys, {module}; heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]; print(heavy)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"{module} loads {proc.stdout.strip()}"
