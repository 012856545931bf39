"""CheckpointManager on real files, including a save killed with SIGKILL in a real subprocess."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager
from nemo_rl_clone.utils.checkpoint_fs import replace_dir
from nemo_rl_clone.utils.checkpoint_ranking import get_metric
from nemo_rl_clone.utils.checkpoint_schedule import SaveDeadline, must_save_by_deadline, parse_deadline, should_save
from tests.functional.supervised_runs import LiveRun


def _manager(tmp_path: Path, **overrides) -> CheckpointManager:
    return CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path / "ckpt"), **overrides))


def _save(manager: CheckpointManager, step: int, info: dict, payload: str = "") -> Path:
    tmp = manager.init_tmp_checkpoint(step, info, run_config={"step": step})
    (tmp / "payload.txt").write_text(payload or f"step {step}")
    return manager.finalize_checkpoint(tmp)


def _names(manager: CheckpointManager) -> list[str]:
    return sorted(p.name for p in manager.checkpoint_dir.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# Saving and replacing
# ---------------------------------------------------------------------------------------------------------------


def test_finalize_produces_complete_step_dir(tmp_path):
    manager = _manager(tmp_path)
    run_config = {"policy": {"model_name": "tiny", "lr": 1e-5}, "tokenizer": {"name": "${policy.model_name}"}}
    tmp = manager.init_tmp_checkpoint(3, {"step": 3, "val:accuracy": 0.5}, run_config)
    assert tmp == manager.checkpoint_dir / "tmp_step_3"
    (tmp / "policy").mkdir()
    torch.save({"w": torch.ones(2)}, tmp / "policy" / "weights.pt")

    final = manager.finalize_checkpoint(tmp)

    assert final == manager.checkpoint_dir / "step_3"
    assert _names(manager) == ["step_3"]
    assert manager.load_training_info(final) == {"step": 3, "val:accuracy": 0.5}
    saved_config = OmegaConf.load(final / "config.yaml")
    assert saved_config.tokenizer.name == "tiny"  # saved resolved
    assert torch.equal(torch.load(final / "policy" / "weights.pt")["w"], torch.ones(2))
    assert manager.get_latest_checkpoint_path() == final


def test_resave_replaces_existing_step_completely(tmp_path):
    manager = _manager(tmp_path, keep_top_k=None)
    first = manager.init_tmp_checkpoint(5, {"version": 1})
    (first / "only_in_old.txt").write_text("old")
    manager.finalize_checkpoint(first)

    _save(manager, 5, {"version": 2}, payload="new")

    step_5 = manager.checkpoint_dir / "step_5"
    assert manager.load_training_info(step_5) == {"version": 2}
    assert (step_5 / "payload.txt").read_text() == "new"
    assert not (step_5 / "only_in_old.txt").exists()
    assert _names(manager) == ["step_5"]


def test_replace_without_atomic_exchange_keeps_no_backup(tmp_path):
    old, new = tmp_path / "step_1", tmp_path / "tmp_step_1"
    old.mkdir()
    (old / "f").write_text("old")
    new.mkdir()
    (new / "f").write_text("new")

    replace_dir(new, old, use_exchange=False)

    assert (old / "f").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_interrupted_fallback_replace_is_recovered(tmp_path):
    manager = _manager(tmp_path, keep_top_k=None)
    _save(manager, 1, {"version": 1})
    _save(manager, 2, {"version": 1})
    ckpt = manager.checkpoint_dir
    # Crash after step_2 was moved aside but before the new one was renamed in: the old one must come back.
    os.rename(ckpt / "step_2", ckpt / "old_step_2")
    (ckpt / "tmp_step_2").mkdir()
    # Crash after the new step_1 was renamed in but before the backup was deleted: the backup must go.
    (ckpt / "old_step_1").mkdir()
    (ckpt / "old_step_1" / "training_info.json").write_text(json.dumps({"version": 0}))

    recovered = CheckpointManager(manager.cfg)

    assert _names(recovered) == ["step_1", "step_2"]
    assert recovered.load_training_info(ckpt / "step_1") == {"version": 1}
    assert recovered.load_training_info(ckpt / "step_2") == {"version": 1}


def test_stale_tmp_dirs_are_removed(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    for debris in ("tmp_step_7", "tmp_delete_step_2"):
        (ckpt / debris / "policy").mkdir(parents=True)
        (ckpt / debris / "policy" / "half.bin").write_bytes(b"\0" * 10)
    (ckpt / "step_not_a_number").mkdir()

    with caplog.at_level(logging.WARNING, logger="nemo_rl_clone.utils.checkpoint"):
        manager = _manager(tmp_path)

    assert _names(manager) == ["step_not_a_number"]
    assert "tmp_step_7" in caplog.text and "interrupted" in caplog.text
    assert manager.get_latest_checkpoint_path() is None

    # A stale tmp dir for the step being saved (e.g. a previous failed attempt) is replaced, not merged.
    stale = manager.checkpoint_dir / "tmp_step_4"
    stale.mkdir()
    (stale / "leftover.bin").write_bytes(b"x")
    fresh = manager.init_tmp_checkpoint(4, {})
    assert not (fresh / "leftover.bin").exists()


def test_latest_ignores_incomplete_and_foreign_dirs(tmp_path):
    manager = _manager(tmp_path, keep_top_k=None)
    _save(manager, 2, {})
    _save(manager, 10, {})
    (manager.checkpoint_dir / "step_99").mkdir()  # no training_info.json: not a checkpoint
    (manager.checkpoint_dir / "notes").mkdir()

    assert manager.get_latest_checkpoint_path() == manager.checkpoint_dir / "step_10"
    assert [step for step, _ in manager.list_checkpoints()] == [2, 10]


# ---------------------------------------------------------------------------------------------------------------
# Retention
# ---------------------------------------------------------------------------------------------------------------


def test_top_k_higher_is_better_keeps_latest(tmp_path):
    manager = _manager(tmp_path, keep_top_k=2, metric_name="val:accuracy", higher_is_better=True)
    for step, accuracy in enumerate([0.1, 0.9, 0.5, 0.7, 0.2], start=1):
        _save(manager, step, {"val:accuracy": accuracy})

    # Best two are step_2 (0.9) and step_4 (0.7); step_5 is kept only because it is the latest.
    assert _names(manager) == ["step_2", "step_4", "step_5"]
    assert manager.get_best_checkpoint_path() == manager.checkpoint_dir / "step_2"
    assert manager.get_latest_checkpoint_path() == manager.checkpoint_dir / "step_5"


def test_top_k_lower_is_better_with_nested_metric(tmp_path):
    manager = _manager(tmp_path, keep_top_k=2, metric_name="train:loss", higher_is_better=False)
    for step, loss in enumerate([3.0, 1.0, 2.0, 0.5], start=1):
        _save(manager, step, {"train": {"loss": loss}})

    assert _names(manager) == ["step_2", "step_4"]  # latest (step_4) is also the best
    assert manager.get_best_checkpoint_path() == manager.checkpoint_dir / "step_4"


def test_missing_metric_ranks_last_and_warns_once(tmp_path, caplog):
    # Lower-is-better, so a missing value read as 0.0 would wrongly beat the real loss of 0.3.
    manager = _manager(tmp_path, keep_top_k=1, metric_name="val:loss", higher_is_better=False)
    with caplog.at_level(logging.WARNING, logger="nemo_rl_clone.utils.checkpoint"):
        _save(manager, 1, {"val:loss": 0.3})
        _save(manager, 2, {"train": {"loss": 0.1}})  # no validation at this step
        _save(manager, 3, {"val": {"loss": float("nan")}})  # NaN cannot rank
        _save(manager, 4, {})

    assert _names(manager) == ["step_1", "step_4"]
    assert manager.get_best_checkpoint_path() == manager.checkpoint_dir / "step_1"
    warnings = [r for r in caplog.records if "rank last" in r.getMessage()]
    assert len(warnings) == 1


def test_keep_all_and_keep_latest_k(tmp_path):
    keep_all = _manager(tmp_path / "a", keep_top_k=None)
    for step in range(1, 5):
        _save(keep_all, step, {"val:accuracy": 0.0})
    assert _names(keep_all) == ["step_1", "step_2", "step_3", "step_4"]

    latest_k = _manager(tmp_path / "b", keep_top_k=2, metric_name=None)
    for step, accuracy in zip((1, 2, 3, 4), (0.9, 0.8, 0.1, 0.0), strict=True):
        _save(latest_k, step, {"val:accuracy": accuracy})
    assert _names(latest_k) == ["step_3", "step_4"]
    assert latest_k.get_best_checkpoint_path() == latest_k.checkpoint_dir / "step_4"


def test_get_metric_prefers_flat_key_then_nested():
    assert get_metric({"val:accuracy": 0.2, "val": {"accuracy": 0.9}}, "val:accuracy") == 0.2
    assert get_metric({"val": {"accuracy": 0.9}}, "val:accuracy") == 0.9
    assert get_metric({"val": {"accuracy": 1}}, "val:accuracy") == 1.0
    assert get_metric({"val": 0.9}, "val:accuracy") is None
    assert get_metric({"val:accuracy": True}, "val:accuracy") is None
    assert get_metric({}, "val:accuracy") is None


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(tmp_path):
    manager = _manager(tmp_path)
    with pytest.raises(TypeError, match=r"training_info\['val:accuracy'\] must be a number.*str"):
        manager.init_tmp_checkpoint(1, {"val": {"accuracy": "high"}})
    with pytest.raises(TypeError, match="training_info for step 1 is not JSON-serializable"):
        manager.init_tmp_checkpoint(1, {"tensor": torch.zeros(2)})
    with pytest.raises(ValueError, match="non-negative int"):
        manager.init_tmp_checkpoint(-1, {})

    stray = tmp_path / "elsewhere" / "tmp_step_1"
    stray.mkdir(parents=True)
    with pytest.raises(ValueError, match="not a tmp_step_N directory"):
        manager.finalize_checkpoint(stray)
    unprepared = manager.checkpoint_dir / "tmp_step_2"
    unprepared.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"training_info\.json is missing"):
        manager.finalize_checkpoint(unprepared)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        manager.load_training_info(tmp_path)


def test_config_check_reports_each_bad_key():
    assert CheckpointingConfig().check() == []
    bad = CheckpointingConfig(
        checkpoint_dir="",
        metric_name="accuracy",
        keep_top_k=0,
        save_period=0,
        checkpoint_must_save_by="3h",
        model_save_format="pickle",
        sigterm_grace_period_s=0,
    )
    problems = dict(bad.check())
    assert set(problems) == {
        "checkpoint_dir",
        "metric_name",
        "keep_top_k",
        "save_period",
        "checkpoint_must_save_by",
        "model_save_format",
        "sigterm_grace_period_s",
    }
    assert "'<prefix>:<name>'" in problems["metric_name"]
    assert "DD:HH:MM:SS" in problems["checkpoint_must_save_by"]
    assert "['safetensors', 'torch_save']" in problems["model_save_format"]
    assert CheckpointingConfig(metric_name=None, keep_top_k=None, checkpoint_must_save_by="00:03:30:00").check() == []


# ---------------------------------------------------------------------------------------------------------------
# Schedule
# ---------------------------------------------------------------------------------------------------------------


def test_parse_deadline():
    assert parse_deadline("00:03:45:00") == 3 * 3600 + 45 * 60
    assert parse_deadline("1:00:00:05") == 86400 + 5
    assert parse_deadline(" 00:00:00:30 ") == 30
    for bad in ("03:45:00", "00:03:45:00:00", "aa:bb:cc:dd", "", "00:-1:00:00"):
        with pytest.raises(ValueError, match=r"expected 'DD:HH:MM:SS'"):
            parse_deadline(bad)
    with pytest.raises(ValueError, match="hours must be < 24"):
        parse_deadline("00:24:00:00")
    with pytest.raises(ValueError, match="minutes must be < 60"):
        parse_deadline("00:00:60:00")


def test_should_save_and_deadline():
    cfg = CheckpointingConfig(save_period=3, checkpoint_must_save_by="00:00:01:40")  # 100 s
    assert [s for s in range(1, 10) if should_save(s, cfg, is_last_step=False)] == [3, 6, 9]
    assert should_save(4, cfg, is_last_step=True)
    assert not should_save(3, CheckpointingConfig(enabled=False, save_period=3), is_last_step=True)

    assert not must_save_by_deadline(cfg, start_time=1000.0, now=1099.0)
    assert must_save_by_deadline(cfg, start_time=1000.0, now=1100.0)
    assert must_save_by_deadline(cfg, start_time=1000.0, now=1080.0, expected_step_s=25.0)
    assert not must_save_by_deadline(CheckpointingConfig(), start_time=0.0, now=1e9)

    deadline = SaveDeadline(cfg, start_time=0.0)
    deadline.mark_step(now=30.0)
    deadline.mark_step(now=40.0)
    assert deadline.longest_step_s == 30.0
    assert not deadline.reached(now=69.0)
    assert deadline.reached(now=70.0)  # 70 s elapsed + a 30 s step would hit the 100 s budget


# ---------------------------------------------------------------------------------------------------------------
# Crash: SIGKILL in the middle of a save
# ---------------------------------------------------------------------------------------------------------------

_CRASHING_SAVER = textwrap.dedent(
    """
    import sys, time
    import torch
    from nemo_rl_clone.utils.checkpoint import CheckpointingConfig, CheckpointManager

    ckpt_dir, reference_path, crash_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=ckpt_dir, keep_top_k=None))

    tmp = manager.init_tmp_checkpoint(1, {"step": 1, "val:accuracy": 0.5}, {"seed": 1})
    (tmp / "policy").mkdir()
    torch.save(torch.load(reference_path), tmp / "policy" / "weights.pt")
    manager.finalize_checkpoint(tmp)

    tmp = manager.init_tmp_checkpoint(crash_step, {"step": crash_step, "val:accuracy": 0.9}, {"seed": 2})
    (tmp / "policy").mkdir()
    chunk = b"\\xab" * (1 << 20)
    with open(tmp / "policy" / "weights.pt", "wb") as f:
        f.write(chunk)
        f.flush()
        print("WRITING", flush=True)
        for _ in range(600):  # bounded: never outlives a forgotten test by more than ~60 s
            f.write(chunk)
            time.sleep(0.1)
    manager.finalize_checkpoint(tmp)
    print("FINISHED", flush=True)
    """
)


@pytest.mark.parametrize("crash_step", [2, 1], ids=["while_saving_next_step", "while_resaving_same_step"])
def test_sigkill_mid_save_leaves_previous_checkpoint_intact(tmp_path, crash_step):
    ckpt_dir = tmp_path / "ckpt"
    reference = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    torch.save(reference, tmp_path / "reference.pt")
    script = tmp_path / "saver.py"
    script.write_text(_CRASHING_SAVER)

    saver = LiveRun(
        [sys.executable, str(script), str(ckpt_dir), str(tmp_path / "reference.pt"), str(crash_step)], tmp_path
    )
    try:
        saver.wait_for_line("WRITING", timeout_s=120)
    finally:
        saver.kill()
    assert saver.proc.returncode == -signal.SIGKILL
    assert (ckpt_dir / f"tmp_step_{crash_step}").is_dir()  # the kill really hit a half-written save

    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(ckpt_dir), keep_top_k=None))

    latest = manager.get_latest_checkpoint_path()
    assert latest == ckpt_dir / "step_1"
    assert manager.load_training_info(latest) == {"step": 1, "val:accuracy": 0.5}
    assert OmegaConf.load(latest / "config.yaml").seed == 1
    assert torch.equal(torch.load(latest / "policy" / "weights.pt"), reference)
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_1"]  # no step_2, tmp debris cleaned
