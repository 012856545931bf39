"""Checkpoints that prove themselves (manifests, fallback on resume), a full disk, one run per checkpoint dir, and the
warnings that save a wasted run (greedy GRPO groups)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.algorithms.run.save_guard import SaveFailed, guarded_save, storage_error
from nemo_rl_clone.utils.checkpoint import (
    CheckpointManager,
    CheckpointsUnusable,
    find_checkpoint_step,
    require_verified_weights,
)
from nemo_rl_clone.utils.checkpoint_lock import LOCK_FILE, CheckpointDirInUse, CheckpointDirLock
from nemo_rl_clone.utils.checkpoint_manifest import MANIFEST_FILE, verify_checkpoint
from nemo_rl_clone.utils.config import load_config
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config
from nemo_rl_clone.utils.logger import Logger


def _manager(directory: Path, **cfg) -> CheckpointManager:
    return CheckpointManager({"checkpoint_dir": str(directory), "metric_name": None, "keep_top_k": None, **cfg})


def _save(manager: CheckpointManager, step: int, payload_bytes: int = 4096, **info) -> Path:
    tmp = manager.init_tmp_checkpoint(step, {"step": step, **info})
    (tmp / "policy" / "weights").mkdir(parents=True)
    torch.save({"w": torch.arange(payload_bytes // 4, dtype=torch.float32) + step}, tmp / "policy/weights/__0_0.pt")
    return manager.finalize_checkpoint(tmp)


def test_manifest_lists_every_file_and_names_the_first_damage(tmp_path):
    step_1 = _save(_manager(tmp_path), 1)
    manifest = json.loads((step_1 / MANIFEST_FILE).read_text())
    on_disk = {p.relative_to(step_1).as_posix() for p in step_1.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    assert set(manifest["files"]) == on_disk == {"training_info.json", "policy/weights/__0_0.pt"}
    assert manifest["step"] == 1 and all(len(e["xxh3_128"]) == 32 for e in manifest["files"].values())
    assert verify_checkpoint(step_1) is None

    weights = step_1 / "policy/weights/__0_0.pt"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert verify_checkpoint(step_1) == (
        f"policy/weights/__0_0.pt has {len(data) // 2} bytes, the manifest says {len(data)}"
    )
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert "policy/weights/__0_0.pt does not match its xxh3-128 hash" in verify_checkpoint(step_1)
    weights.unlink()
    assert verify_checkpoint(step_1) == "policy/weights/__0_0.pt is missing"
    (step_1 / MANIFEST_FILE).unlink()
    assert verify_checkpoint(step_1).startswith("manifest.json is missing (training_info.json says")


def test_resume_falls_back_past_damaged_checkpoints_and_keeps_them_aside(tmp_path, capsys):
    manager = _manager(tmp_path)
    for step in (1, 2, 3):
        _save(manager, step)
    size = (tmp_path / "step_3/policy/weights/__0_0.pt").stat().st_size
    (tmp_path / "step_3/policy/weights/__0_0.pt").write_bytes(b"torn")
    (tmp_path / "step_2" / MANIFEST_FILE).unlink()

    resumed = _manager(tmp_path)
    assert resumed.verify_latest() == tmp_path / "step_1"
    captured = capsys.readouterr()
    lines = captured.err.splitlines()  # a fault verdict: stderr, not stdout
    assert "fails verification" not in captured.out
    assert lines == [
        f"Checkpoint {tmp_path / 'step_3'} fails verification: policy/weights/__0_0.pt has 4 bytes, the manifest says "
        f"{size}; moved aside to corrupt_step_3",
        f"Checkpoint {tmp_path / 'step_2'} fails verification: manifest.json is missing (training_info.json says the "
        "checkpoint was written with one); moved aside to corrupt_step_2",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt_step_2", "corrupt_step_3", "step_1"]
    assert resumed.get_latest_checkpoint_path() == tmp_path / "step_1"

    (tmp_path / "step_1/training_info.json").write_text("{}")  # the last one goes too: nothing left to resume from
    with pytest.raises(CheckpointsUnusable) as refused:
        _manager(tmp_path).verify_latest()
    assert str(refused.value) == (
        f"checkpointing.checkpoint_dir {tmp_path}: no checkpoint passes verification (moved aside: corrupt_step_1); "
        "restore one, or use another checkpoint_dir to start fresh"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt_step_1", "corrupt_step_2", "corrupt_step_3"]


def test_a_checkpoint_from_before_manifests_loads_with_a_notice(tmp_path, capsys):
    old = tmp_path / "step_4"
    (old / "policy" / "weights").mkdir(parents=True)
    (old / "training_info.json").write_text(json.dumps({"step": 4}))
    assert _manager(tmp_path).verify_latest() == old
    assert (
        capsys.readouterr().out
        == f"Checkpoint {old} was written before checkpoints had manifests: resuming from it unverified\n"
    )


def test_keep_top_k_never_prunes_the_only_verified_checkpoint(tmp_path):
    manager = _manager(tmp_path, metric_name="val:accuracy", keep_top_k=1)
    _save(manager, 1, val={"accuracy": 0.1})
    for step, accuracy in ((2, 0.9), (3, 0.5)):  # written by hand, as an older version would have: unverifiable
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}/training_info.json").write_text(
            json.dumps({"step": step, "val": {"accuracy": accuracy}})
        )
    manager.remove_old_checkpoints()  # the top 1 (step 2) and the latest (step 3) would leave nothing verified
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_1", "step_2", "step_3"]
    fresh = _manager(tmp_path, metric_name="val:accuracy", keep_top_k=1)  # has verified nothing: plain top-k
    fresh.remove_old_checkpoints()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_2", "step_3"]


_HOLD_LOCK = textwrap.dedent(
    """
    import sys, time
    from nemo_rl_clone.utils.checkpoint import CheckpointManager
    from nemo_rl_clone.utils.errors import reporting_user_errors
    with reporting_user_errors():
        CheckpointManager({{"checkpoint_dir": sys.argv[1]}}, lock=True)
        print("locked", flush=True)
        time.sleep({hold})
    """
)


def _lock_holder(directory: Path, hold: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK.format(hold=hold), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_one_run_per_checkpoint_dir(tmp_path, capsys):
    holder = _lock_holder(tmp_path, hold=60)
    try:
        assert holder.stdout.readline() == "locked\n"
        second = _lock_holder(tmp_path, hold=0)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert err.splitlines() == [
            f"error: checkpointing.checkpoint_dir {tmp_path} is in use by another run (pid {holder.pid} on "
            f"{record['host']}, started {record['started']}; lock file {tmp_path / LOCK_FILE}): wait for it to end, "
            "or use another checkpoint_dir; remove the lock file only if that run is gone"
        ]
    finally:
        holder.kill()
        holder.wait()
    # SIGKILL left the lock behind; its process is gone, so the next run takes it over with a notice
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid
    manager = CheckpointManager({"checkpoint_dir": str(tmp_path)}, lock=True)
    assert (
        f"Taking over the lock {tmp_path / LOCK_FILE} of a run that is gone (pid {holder.pid} on"
        in capsys.readouterr().out
    )
    CheckpointManager({"checkpoint_dir": str(tmp_path)}, lock=True)  # the same process again: already its lock
    assert manager.lock is not None
    manager.lock.release()
    assert not (tmp_path / LOCK_FILE).exists()

    finished = _lock_holder(tmp_path, hold=0)  # a run that ends normally removes its lock
    finished.communicate(timeout=60)
    assert finished.returncode == 0 and not (tmp_path / LOCK_FILE).exists()

    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "yesterday"}))
    with pytest.raises(CheckpointDirInUse, match=r"in use by another run \(pid 1 on elsewhere, started yesterday"):
        CheckpointDirLock(tmp_path).acquire()  # another host's holder is never presumed dead


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (needs CAP_SYS_ADMIN, which CI's root has)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): needs root with CAP_SYS_ADMIN")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _run_config(save_optimizer: bool = True) -> SimpleNamespace:
    checkpointing = SimpleNamespace(save_optimizer=save_optimizer)
    return SimpleNamespace(policy=SimpleNamespace(model_name="tiny-random-llama"), checkpointing=checkpointing)


def test_a_save_that_cannot_fit_is_refused_before_it_starts(small_disk):
    manager = _manager(small_disk)
    step_1 = _save(manager, 1, payload_bytes=600_000)
    calls = []
    with pytest.raises(SaveFailed) as failed:
        guarded_save(manager, 2, _run_config(), lambda: calls.append(1), "stop")
    assert calls == []  # nothing was written
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize / 1024
    assert str(failed.value) == (
        f"checkpoint of step 2 not saved: {small_disk} has {free:.1f} KiB free, a checkpoint needs about "
        f"{sum(p.stat().st_size for p in step_1.rglob('*') if p.is_file() and p.name != MANIFEST_FILE) / 1024:.1f} "
        f"KiB (the size of step_1); last complete checkpoint: {step_1} (verified)"
    )
    # the first checkpoint's estimate: tiny-random-llama's parameters x (4 + 8) bytes, far above 1 MiB
    with pytest.raises(SaveFailed, match=r"M parameters x 12 bytes\); no complete checkpoint yet$"):
        guarded_save(_manager(small_disk / "fresh"), 1, _run_config(), lambda: None, "stop")


def test_a_save_that_fills_the_disk_midway_names_the_os_error_and_keeps_the_previous_one(small_disk, capsys):
    manager = _manager(small_disk)
    step_1 = _save(manager, 1)

    def write() -> Path:  # torch's zip writer on a full disk: "unexpected pos ...", no errno in sight
        tmp = manager.init_tmp_checkpoint(2, {"step": 2})
        torch.save({"w": torch.zeros(1 << 20)}, tmp / "weights.pt")
        return manager.finalize_checkpoint(tmp)

    with pytest.raises(RuntimeError) as raw:
        write()
    assert "No space left" not in str(raw.value)  # what the run showed before: nothing about the disk
    assert storage_error(raw.value, small_disk) == "[Errno 28] No space left on device"  # found by the probe
    del raw  # its traceback holds the half-written file open
    gc.collect()
    shutil.rmtree(small_disk / "tmp_step_2")
    for action in ("stop", "continue"):
        expected = (
            f"checkpoint of step 2 not saved: writing to {small_disk} failed: [Errno 28] No space left on device; "
            f"last complete checkpoint: {step_1} (verified)"
        )
        if action == "stop":
            with pytest.raises(SaveFailed) as failed:
                guarded_save(manager, 2, _run_config(), write, action)
            assert str(failed.value) == expected
        else:
            assert guarded_save(manager, 2, _run_config(), write, action) is None
            assert capsys.readouterr().err.endswith(
                f"{expected}; training on without it (checkpointing.on_save_failure=continue)\n"
            )
        assert sorted(p.name for p in small_disk.iterdir()) == ["step_1"]  # debris gone, step_1 intact
        assert verify_checkpoint(step_1) is None
    with pytest.raises(ZeroDivisionError):  # not a storage error: propagates untouched
        guarded_save(manager, 2, _run_config(), lambda: 1 / 0, "continue")


def test_a_full_disk_costs_log_lines_not_the_run(small_disk, caplog):
    logger = Logger({"log_dir": str(small_disk), "tensorboard_enabled": False}, quiet=True)
    filler = small_disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        out.write(b"\0" * (2 << 20))
    logger.log_metrics({"loss": 1.0}, step=1, prefix="train")
    logger.log_metrics({"loss": 2.0}, step=2, prefix="train")
    logger.log_samples_jsonl([{"prompt": "x" * 10_000}], step=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2  # one per sink and failure streak, not one per write
    assert warnings[0].startswith(f"logger: JsonlBackend could not write step 1 under {small_disk} ([Errno 28]")
    assert warnings[1].startswith("logger: sample dump could not write step 2")
    assert not (small_disk / "train_data_step2.jsonl").exists()
    filler.unlink()
    logger.log_metrics({"loss": 3.0}, step=3, prefix="train")
    logger.finish()
    lines = (small_disk / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 3, "train/loss": 3.0}]  # whole lines only


def _grpo(*overrides: str) -> GRPOMasterConfig:
    smoke = Path(__file__).parents[2] / "configs" / "grpo_smoke.yaml"
    config = OmegaConf.merge(load_config(smoke), OmegaConf.from_dotlist(list(overrides)))
    return validate_config(OmegaConf.to_container(config, resolve=True), GRPOMasterConfig)


@pytest.mark.parametrize(
    ("overrides", "key", "what"),
    [
        (["policy.generation.temperature=0"], "policy.generation.temperature", "temperature 0"),
        (["policy.generation.top_k=1"], "policy.generation.top_k", "top_k 1"),
    ],
)
def test_greedy_groups_are_refused_unless_asked_for(overrides, key, what):
    with pytest.raises(ConfigError) as refused:
        _grpo(*overrides)
    assert refused.value.problems == [
        f"{key}: {what} samples greedily: the 2 generations of a prompt are identical, so every advantage is 0 and "
        "GRPO learns nothing; sample (e.g. temperature 1.0), or set grpo.allow_greedy_groups=true if the rewards vary "
        "on their own"
    ]
    assert _grpo(*overrides, "grpo.allow_greedy_groups=true").grpo.allow_greedy_groups
    one = ("grpo.num_generations_per_prompt=1", "grpo.use_leave_one_out_baseline=false")
    assert _grpo(*overrides, *one, "policy.train_global_batch_size=4")  # one sample per prompt: nothing to compare


def test_evaluation_and_converters_refuse_a_damaged_checkpoint_by_name(tmp_path):
    step_1 = _save(_manager(tmp_path), 1)
    (step_1 / "policy" / "hf").mkdir()  # what an evaluation adds later (a converted folder) is not damage
    (step_1 / "policy" / "hf" / "config.json").write_text("{}")
    assert find_checkpoint_step(tmp_path) == step_1
    require_verified_weights(step_1 / "policy" / "weights")
    (step_1 / "policy/weights/__0_0.pt").write_bytes(b"")
    for call in (lambda: find_checkpoint_step(tmp_path), lambda: require_verified_weights(step_1 / "policy/weights")):
        with pytest.raises(CheckpointsUnusable) as refused:
            call()
        assert str(refused.value) == (
            f"checkpoint {step_1} fails verification: policy/weights/__0_0.pt has 0 bytes, the manifest says "
            f"{json.loads((step_1 / MANIFEST_FILE).read_text())['files']['policy/weights/__0_0.pt']['size']}"
        )
