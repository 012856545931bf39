"""NeMo-RL-style calls into utils: CheckpointManager with a dict config, config loading and hydra overrides, the
Logger with a dict config, and the Timer / TimeoutChecker. Each call is written as a NeMo-RL script writes it."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from nemo_rl_clone.utils.checkpoint import CheckpointManager
from nemo_rl_clone.utils.config import (
    OverridesError,
    load_config,
    load_config_with_inheritance,
    parse_hydra_overrides,
    register_omegaconf_resolvers,
    resolve_path,
)
from nemo_rl_clone.utils.config_validation import ConfigError
from nemo_rl_clone.utils.logger import Logger, flatten_dict, print_message_log_samples
from nemo_rl_clone.utils.timer import TimeoutChecker, Timer, convert_to_seconds

# ---------------------------------------------------------------------------------------------------------------
# utils.checkpoint
# ---------------------------------------------------------------------------------------------------------------


def _nemo_rl_checkpointing(tmp_path, **overrides):
    """The ``checkpointing`` section as a NeMo-RL recipe writes it (a plain dict)."""
    return {
        "enabled": True,
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "metric_name": "val:accuracy",
        "higher_is_better": True,
        "keep_top_k": 2,
        "save_period": 1,
        **overrides,
    }


def _save(manager, step, accuracy):
    tmp = manager.init_tmp_checkpoint(step, {"step": step, "val:accuracy": accuracy}, {"policy": {"model_name": "m"}})
    (tmp / "policy").mkdir()
    (tmp / "policy" / "weights.pt").write_bytes(b"w" * step)
    manager.finalize_checkpoint(tmp)


def test_checkpoint_manager_takes_nemo_rl_dict_and_prunes_to_top_k(tmp_path):
    manager = CheckpointManager(_nemo_rl_checkpointing(tmp_path))
    assert (manager.metric_name, manager.higher_is_better, manager.keep_top_k, manager.save_period) == (
        "val:accuracy",
        True,
        2,
        1,
    )
    assert manager.get_latest_checkpoint_path() is None
    assert manager.load_training_info(manager.get_latest_checkpoint_path()) is None  # NeMo-RL's fresh-run idiom

    for step, accuracy in [(1, 0.3), (2, 0.9), (3, 0.5), (4, 0.1)]:
        _save(manager, step, accuracy)
    # top-2 by accuracy are steps 2 and 3; step 4 is the latest and is kept too (exclude_latest=True)
    remaining = sorted(p.name for p in manager.checkpoint_dir.iterdir())
    assert remaining == ["step_2", "step_3", "step_4"]
    assert manager.get_best_checkpoint_path() == manager.checkpoint_dir / "step_2"
    latest = manager.get_latest_checkpoint_path()
    assert latest == manager.checkpoint_dir / "step_4"
    assert manager.load_training_info(latest) == {"step": 4, "val:accuracy": 0.1}
    assert (latest / "policy" / "weights.pt").read_bytes() == b"wwww"
    assert OmegaConf.load(latest / "config.yaml").policy.model_name == "m"

    removed = manager.remove_old_checkpoints(exclude_latest=False)
    assert removed == [manager.checkpoint_dir / "step_4"]
    assert sorted(p.name for p in manager.checkpoint_dir.iterdir()) == ["step_2", "step_3"]


def test_checkpoint_training_info_tensors_become_numbers_and_tmp_path_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manager = CheckpointManager({**_nemo_rl_checkpointing(tmp_path), "checkpoint_dir": "relative_ckpt"})
    info = {"step": 1, "val:accuracy": torch.tensor(0.75), "consumed_samples": np.array([64])}
    tmp = manager.init_tmp_checkpoint(1, info)
    assert tmp.is_absolute() and tmp == tmp_path / "relative_ckpt" / "tmp_step_1"
    final = manager.finalize_checkpoint(tmp)
    assert json.loads((final / "training_info.json").read_text()) == {
        "step": 1,
        "val:accuracy": 0.75,
        "consumed_samples": 64,
        "manifest": True,  # ours: this checkpoint has a manifest to verify (load_training_info leaves it out)
    }
    assert manager.load_training_info(final) == {"step": 1, "val:accuracy": 0.75, "consumed_samples": 64}


def test_checkpoint_resume_paths(tmp_path):
    assert CheckpointManager.get_resume_paths(None) == (None, None)
    step = tmp_path / "step_3"
    (step / "policy" / "weights").mkdir(parents=True)
    with pytest.warns(UserWarning, match="no optimizer state"):
        assert CheckpointManager.get_resume_paths(step) == (step / "policy" / "weights", None)
    (step / "policy" / "optimizer").mkdir()
    assert CheckpointManager.get_resume_paths(str(step)) == (step / "policy" / "weights", step / "policy" / "optimizer")


def test_checkpoint_dict_config_with_unknown_key_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpointing\.keep_top_kk: unknown key"):
        CheckpointManager({**_nemo_rl_checkpointing(tmp_path), "keep_top_kk": 3})


# ---------------------------------------------------------------------------------------------------------------
# utils.config
# ---------------------------------------------------------------------------------------------------------------


def test_load_config_with_inheritance_and_base_dir(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.yaml").write_text("a: 1\nb: {c: 2, d: 3}\n")
    (tmp_path / "child.yaml").write_text("defaults: parent.yaml\nb: {c: 20}\n")
    cfg = load_config_with_inheritance(tmp_path / "child.yaml", base_dir=tmp_path / "base")
    assert OmegaConf.to_container(cfg) == {"a": 1, "b": {"c": 20, "d": 3}}
    (tmp_path / "child2.yaml").write_text("defaults: base/parent.yaml\na: 5\n")
    assert OmegaConf.to_container(load_config(tmp_path / "child2.yaml")) == {"a": 5, "b": {"c": 2, "d": 3}}
    assert resolve_path(tmp_path, "x.yaml") == tmp_path / "x.yaml"
    assert resolve_path(tmp_path, "/abs/x.yaml").as_posix() == "/abs/x.yaml"


def test_parse_hydra_overrides_applies_and_raises_overrides_error():
    cfg = OmegaConf.create({"policy": {"lr": 1e-6, "name": "m"}, "grpo": {"seed": 1}})
    cfg.grpo.double_seed = "${mul:${grpo.seed},2}"
    out = parse_hydra_overrides(cfg, ["policy.lr=3e-6", "+policy.extra=[1, 2]", "++grpo.seed=7", "~policy.name"])
    assert out is cfg  # updated in place, as NeMo-RL does
    assert OmegaConf.to_container(cfg, resolve=True) == {
        "policy": {"lr": 3e-6, "extra": [1, 2]},
        "grpo": {"seed": 7, "double_seed": 14},  # the interpolation survived the update
    }
    before = OmegaConf.to_container(cfg)
    with pytest.raises(OverridesError) as info:
        parse_hydra_overrides(cfg, ["policy.lrr=1", "+grpo.seed=2"])
    message = str(info.value)
    assert message.startswith("Failed to parse Hydra overrides: override 'policy.lrr=1': policy.lrr does not exist")
    assert "did you mean policy.lr?" in message
    assert "override '+grpo.seed=2': grpo.seed already exists" in message
    assert len(info.value.problems) == 2
    assert OmegaConf.to_container(cfg) == before  # a failed parse changes nothing
    assert isinstance(info.value, Exception) and isinstance(info.value, ConfigError)


def test_registered_resolvers_compute():
    register_omegaconf_resolvers()  # idempotent: already registered on import
    cfg = OmegaConf.create(
        {"n": 6, "m": 4, "add": "${add:${n},${m}}", "sub": "${sub:${n},${m}}", "mul": "${mul:${n},${m}}"}
    )
    cfg.div = "${div:${n},${m}}"
    cfg.max = "${max:${n},${m}}"
    assert OmegaConf.to_container(cfg, resolve=True) == {
        "n": 6,
        "m": 4,
        "add": 10,
        "sub": 2,
        "mul": 24,
        "div": 1.5,
        "max": 6,
    }


# ---------------------------------------------------------------------------------------------------------------
# utils.logger
# ---------------------------------------------------------------------------------------------------------------


def _nemo_rl_logger_cfg(log_dir):
    return {
        "log_dir": str(log_dir),
        "wandb_enabled": False,
        "tensorboard_enabled": False,
        "mlflow_enabled": False,
        "monitor_gpus": False,
    }


def _metrics_lines(log_dir):
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def test_logger_from_dict_config_logs_with_prefix_and_step_metric(tmp_path):
    logger = Logger(_nemo_rl_logger_cfg(tmp_path / "exp"))
    try:
        assert logger.base_log_dir == str(tmp_path / "exp")
        logger.log_metrics({"loss": 0.5, "val_step": 3}, step=2, prefix="train", step_metric="val_step")
        logger.log_metrics({"accuracy": torch.tensor(0.25)}, 4, prefix=None)
        logger.log_hyperparams({"policy": {"lr": 1e-6, "sizes": [1, 2]}})
    finally:
        logger.finish()
    assert _metrics_lines(tmp_path / "exp") == [
        {"step": 2, "train/loss": 0.5, "val_step": 3},
        {"step": 4, "accuracy": 0.25},
    ]


def test_logger_jsonl_writers_and_plot(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    with Logger(_nemo_rl_logger_cfg(tmp_path), quiet=True) as logger:
        batch = {"reward": torch.tensor([1.0, 0.0]), "text": ["a", "b"]}
        path = logger.log_batched_dict_as_jsonl(batch, "train_data_step1.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        # NeMo-RL's format: each value is the sample's one-row slice
        assert rows == [{"reward": [1.0], "text": ["a"], "idx": 0}, {"reward": [0.0], "text": ["b"], "idx": 1}]

        logger.log_string_list_as_jsonl(['{"a": 1}'], "strings.jsonl")
        logger.log_string_list_as_jsonl(['{"a": 2}'], "strings.jsonl")
        assert (tmp_path / "strings.jsonl").read_text() == '{"a": 1}\n{"a": 2}\n'

        figure = plt.figure()
        plt.plot([0, 1], [1, 0])
        plot = logger.log_plot(figure, 5, "train/curve")
        plt.close(figure)
        assert plot == tmp_path / "plots" / "train" / "curve_step5.png"
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        logger.log_histogram([1.0, 2.0, 2.0], 5, "train/hist")  # no backend with histograms: nothing written


def test_flatten_dict_expands_lists_like_nemo_rl():
    assert flatten_dict({"a": 1, "b": {"c": 2}}) == {"a": 1, "b.c": 2}
    assert flatten_dict({"a": [1, 2], "b": {"c": [3, 4]}}) == {"a.0": 1, "a.1": 2, "b.c.0": 3, "b.c.1": 4}
    assert flatten_dict({"a": [{"b": 1}, {"c": 2}]}) == {"a.0.b": 1, "a.1.c": 2}
    assert flatten_dict({"a": {"b": [1, 2]}}, sep="/", expand_lists=False) == {"a/b": [1, 2]}


def test_print_message_log_samples_shows_best_and_worst(capsys):
    logs = [
        [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        for i in range(5)
    ]
    print_message_log_samples(logs, [0.1, 0.9, 0.5, 0.0, 0.7], num_samples=2, step=3)
    out = capsys.readouterr().out
    assert "answer 1" in out and "answer 3" in out  # best (0.9) and worst (0.0)
    assert not any(f"answer {i}" in out for i in (0, 2, 4))
    with pytest.raises(ValueError, match="2 message logs but 1 rewards"):
        print_message_log_samples(logs[:2], [1.0])


# ---------------------------------------------------------------------------------------------------------------
# utils.timer
# ---------------------------------------------------------------------------------------------------------------


def test_timer_reductions_and_shapes_match_recorded_durations():
    timer = Timer()
    for _ in range(3):
        timer.start("generation")
        timer.stop("generation")
    with timer.time("training"):
        pass
    recorded = timer.get_elapsed("generation")
    assert timer.get_latest_elapsed("generation") == recorded[-1]
    assert timer.reduce("generation") == pytest.approx(statistics.fmean(recorded), rel=1e-12)  # default mean
    assert timer.reduce("generation", "std") == pytest.approx(float(np.std(recorded)), rel=1e-9, abs=1e-15)
    assert timer.reduce("generation", "median") == pytest.approx(float(np.median(recorded)), rel=1e-12)
    metrics = timer.get_timing_metrics()  # NeMo-RL's default reduction is the mean
    assert metrics == {
        "generation": pytest.approx(statistics.fmean(recorded), rel=1e-12),
        "training": timer.get_elapsed("training")[0],
    }
    by_label = timer.get_timing_metrics({"generation": "count"})
    assert by_label == {"generation": 3.0, "training": timer.get_elapsed("training")}  # unmapped: raw list
    with pytest.raises(ValueError, match="already running"):
        timer.start("x")
        timer.start("x")
    with pytest.raises(ValueError, match="'y' is not running"):
        timer.stop("y")
    timer.record("engine_wait", 1.5)
    timer.record("engine_wait", 0.5)
    assert timer.get_timing_metrics("sum")["engine_wait"] == 2.0
    with pytest.raises(ValueError, match="elapsed must be >= 0"):
        timer.record("engine_wait", -1.0)
    timer.reset("never_timed")  # a no-op, as in NeMo-RL
    timer.reset()
    assert timer.get_timing_metrics() == {}


def test_timeout_checker_fires_once():
    assert convert_to_seconds("01:02:03:04") == ((1 * 24 + 2) * 60 + 3) * 60 + 4
    with pytest.raises(ValueError, match="DD:HH:MM:SS"):
        convert_to_seconds("3:45")
    never = TimeoutChecker(timeout=None)
    assert never.check_save() is False
    due = TimeoutChecker(timeout="00:00:00:00")
    assert due.check_save() is True
    assert due.check_save() is False  # only once
    checker = TimeoutChecker(timeout="00:01:00:00", fit_last_save_time=True)
    checker.start_iterations()
    checker.mark_iteration()
    assert checker.check_save() is False  # a near-zero iteration fits in an hour
    checker.iteration_times.append(3600.0)  # an iteration as long as the budget
    assert checker.check_save() is True
