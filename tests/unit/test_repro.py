"""Repro bundles (`rollout.repro`) and the replay's input handling (`rollout.replay`, examples/replay_step.py), without a run.

The replay's recomputation itself is checked on a real run's bundle in tests/functional/test_grpo.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_clone.algorithms.grpo.config import GRPOConfig
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.rollout import repro
from nemo_rl_clone.rollout.replay import close, nonfinite_samples
from nemo_rl_clone.utils.checkpoint import CheckpointingConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from tests.scripts import entry_point_main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([0, 3], "dump_steps: must be step numbers >= 1, got [0, 3]"),
        ([-2], "dump_steps: must be step numbers >= 1, got [-2]"),
        (["2"], "dump_steps[0]: expected int, got str '2'"),
        (2, "dump_steps: expected a list, got int 2"),
    ],
)
def test_dump_steps_validation(value, problem):
    with pytest.raises(ConfigError) as err:
        validate_config({"dump_steps": value}, GRPOConfig)
    assert err.value.problems == [problem]
    assert validate_config({}, GRPOConfig).dump_steps == []
    assert validate_config({"dump_steps": [1, 4]}, GRPOConfig).dump_steps == [1, 4]


def test_bundle_reasons():
    quiet = {"entropy_alert": 0.0, "kl_alert": 0.0}
    finite = {"loss": 0.1, "grad_norm": 2.0}
    assert repro.bundle_reasons(3, [], finite, quiet, {}) == []
    assert repro.bundle_reasons(3, [3], finite, quiet, {}) == ["requested by grpo.dump_steps"]
    assert repro.bundle_reasons(3, [], {"loss": float("nan"), "grad_norm": float("inf")}, quiet, {}) == [
        "train/loss is nan",
        "train/grad_norm is inf",
    ]
    firing = {**quiet, "kl_alert": 1.0, "kl_ratio": 9.0}
    assert repro.bundle_reasons(3, [], finite, firing, {"kl": False}) == ["monitor kl fired"]
    # a monitor that keeps alerting wrote its bundle when it entered the alert state
    assert repro.bundle_reasons(3, [], finite, firing, {"kl": True}) == []


@dataclass
class _Config:
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)


def _components(tmp_path: Path, dump_steps: list[int], latest: Path | None) -> SimpleNamespace:
    config = _Config(GRPOConfig(dump_steps=dump_steps))
    checkpointer = SimpleNamespace(get_latest_checkpoint_path=lambda: latest)
    return SimpleNamespace(config=config, log_dir=tmp_path / "logs", checkpointer=checkpointer)


def _batch() -> BatchedDataDict:
    token_mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    return BatchedDataDict(
        input_ids=torch.tensor([[1, 2, 3], [1, 2, 0]]),
        input_lengths=torch.tensor([3, 2]),
        token_mask=token_mask,
        sample_mask=torch.ones(2),
        advantages=torch.tensor([[0.5] * 3, [-0.5] * 3]),
        generation_logprobs=torch.zeros(2, 3),
    )


def _step(bundles: repro.ReproBundles, step: int, loss: float = 0.1, alerts: float = 0.0) -> Path | None:
    results = {"loss": torch.tensor([loss]), "grad_norm": torch.tensor([1.5])}
    metrics = {"loss": loss, "grad_norm": 1.5}
    return bundles.after_step(step, _batch(), torch.tensor([1.0, 0.0]), results, metrics, {"kl_alert": alerts})


def test_nonfinite_step_writes_a_bundle_linking_the_previous_checkpoint(tmp_path, capsys):
    ckpt = tmp_path / "ckpt" / "step_4"
    (ckpt / "policy" / "weights").mkdir(parents=True)
    (ckpt / "policy" / "weights" / "w.distcp").write_bytes(b"weights")
    bundles = repro.ReproBundles(_components(tmp_path, [], ckpt), {"kl": False})
    assert _step(bundles, 5) is None  # nothing tripped
    out = _step(bundles, 5, loss=float("nan"))
    assert out == tmp_path / "logs" / "repro" / "step_5"
    assert sorted(p.name for p in out.iterdir()) == [
        "batch.pt",
        "bundle.json",
        "checkpoint",
        "config.yaml",
        "metrics.json",
        "versions.json",
    ]
    info = json.loads((out / "bundle.json").read_text())
    assert info["reasons"] == ["train/loss is nan"] and info["start"]["kind"] == "checkpoint"
    linked = out / "checkpoint" / "policy" / "weights" / "w.distcp"
    assert os.stat(linked).st_ino == os.stat(ckpt / "policy" / "weights" / "w.distcp").st_ino  # a hard link
    shutil.rmtree(ckpt)  # keep_top_k pruning the checkpoint: the bundle keeps the weights
    assert linked.read_bytes() == b"weights"
    batch = torch.load(out / "batch.pt", weights_only=True)
    assert torch.equal(batch["advantages"], _batch()["advantages"]) and batch["rewards"].tolist() == [1.0, 0.0]
    logged = json.loads((out / "metrics.json").read_text())
    assert math.isnan(logged["train"]["loss"]) and logged["per_global_batch"]["grad_norm"] == [1.5]
    assert {"torch", "transformers", "vllm", "ray", "python", "nemo_rl_clone", "git_commit"} <= set(
        json.loads((out / "versions.json").read_text())
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if "repro bundle" in line]
    assert lines == [
        f"step 5: repro bundle (train/loss is nan; starts from checkpoint step_4, linked): uv run examples/replay_step.py {out}"
    ]


def test_monitor_entering_alert_and_missing_start_weights(tmp_path):
    bundles = repro.ReproBundles(_components(tmp_path, [], tmp_path / "ckpt" / "step_2"), {"kl": False})
    out = _step(bundles, 7, alerts=1.0)
    assert out is not None
    start = json.loads((out / "bundle.json").read_text())["start"]
    assert start["kind"] == "not_saved" and "step 6" in start["summary"] and not (out / "checkpoint").exists()
    assert _step(bundles, 8, alerts=1.0) is None  # still alerting: no second bundle

    # a monitor's bundle names the checkpoint it started from but does not keep it alive (monitors fire often)
    ckpt = tmp_path / "ckpt" / "step_8"
    (ckpt / "policy" / "weights").mkdir(parents=True)
    named = repro.ReproBundles(_components(tmp_path, [], ckpt), {"kl": False})
    out = _step(named, 9, alerts=1.0)
    assert out is not None and not (out / "checkpoint").exists()
    start = json.loads((out / "bundle.json").read_text())["start"]
    assert start["kind"] == "checkpoint" and start["linked"] is False and start["checkpoint"] == str(ckpt)
    assert start["summary"] == "starts from checkpoint step_8, not linked: replayable while keep_top_k keeps it"


def test_requested_step_checkpoints_the_one_before_and_a_failed_write_warns(tmp_path, capsys):
    bundles = repro.ReproBundles(_components(tmp_path, [3], None), {})
    assert bundles.wants_checkpoint(2) and not bundles.wants_checkpoint(3)
    (tmp_path / "logs").write_text("a file where the log dir should be")  # the bundle cannot be written
    assert _step(bundles, 3) is None
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "repro bundle" in line]
    assert line.startswith("step 3: repro bundle not written (")


def test_nonfinite_samples_names_the_row_and_input():
    batch = dict(_batch())
    batch["generation_logprobs"][1, 2] = float("nan")  # padding of row 1: not a loss token
    batch["advantages"][0] = float("inf")
    lines = nonfinite_samples(batch, group_size=2)
    assert lines == [
        "row 0 (prompt group 0, sample 0): advantages is inf at 3 positions, 2 of its 2 loss tokens",
        "row 1 (prompt group 0, sample 1): generation_logprobs is nan at 1 positions, 0 of its 1 loss tokens",
    ]
    assert close(float("nan"), float("nan")) and not close(1.0, float("nan")) and close(100.0, 100.0005)
    assert not close(0.5, 0.50002)


def _replay_main():
    return entry_point_main("replay_step")


def _fails_with(capsys, args: list[str], line: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _replay_main()(args)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_replay_bad_inputs(tmp_path, capsys):
    _fails_with(
        capsys,
        [str(tmp_path / "nope")],
        f"error: {tmp_path / 'nope'}: no such folder (expected a repro bundle such as <log_dir>/repro/step_N)",
    )
    bundle = tmp_path / "step_3"
    bundle.mkdir()
    (bundle / "bundle.json").write_text(json.dumps({"step": 3, "reasons": [], "start": {"kind": "checkpoint"}}))
    _fails_with(
        capsys, [str(bundle)], f"error: {bundle} is not a repro bundle: config.yaml, batch.pt, metrics.json missing"
    )
    (bundle / "config.yaml").write_text("policy:\n  megatron_cfg: {enabled: true}\n")
    (bundle / "metrics.json").write_text("{}")
    (bundle / "batch.pt").write_bytes(b"not a torch file")
    _fails_with(
        capsys, [str(bundle)], f"error: {bundle / 'batch.pt'}: not a readable torch.save file (UnpicklingError)"
    )
    torch.save(dict(_batch()), bundle / "batch.pt")
    _fails_with(
        capsys,
        [str(bundle)],
        f"error: {bundle}: the run used the Megatron backend (policy.megatron_cfg.enabled); the replay supports the "
        "DTensor backend only",
    )
