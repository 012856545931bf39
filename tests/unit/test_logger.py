import io
import json
import logging
import math
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from rich.console import Console

from nemo_rl_clone.utils.logger import (
    METRICS_FILENAME,
    GpuMonitoringConfig,
    Logger,
    LoggerConfig,
    MLflowConfig,
    WandbConfig,
    get_next_experiment_dir,
)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def quiet_logger(tmp_path: Path, **cfg_kwargs) -> Logger:
    return Logger(LoggerConfig(monitor_gpus=False, **cfg_kwargs), tmp_path, quiet=True)


# --- experiment dirs ---------------------------------------------------------------------------------------------


def test_experiment_dirs_are_numbered_from_one_past_the_largest(tmp_path):
    base = tmp_path / "logs"
    assert get_next_experiment_dir(base) == base / "exp_1"
    assert get_next_experiment_dir(base) == base / "exp_2"
    (base / "exp_7").mkdir()
    (base / "exp_9").write_text("a file also takes the name")
    (base / "exp_x").mkdir()
    (base / "exp_100_old").mkdir()
    created = get_next_experiment_dir(base)
    assert created == base / "exp_10" and created.is_dir()


def test_concurrent_callers_get_distinct_experiment_dirs(tmp_path):
    barrier = threading.Barrier(8)
    results: list[Path] = []

    def worker() -> None:
        barrier.wait()
        results.append(get_next_experiment_dir(tmp_path))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=lambda p: int(p.name[4:])) == [tmp_path / f"exp_{i}" for i in range(1, 9)]


# --- metrics.jsonl and value conversion --------------------------------------------------------------------------


def test_metrics_jsonl_one_object_per_call_with_prefixed_keys(tmp_path):
    with quiet_logger(tmp_path) as logger:
        logged = logger.log_metrics(
            {
                "loss": torch.tensor(0.25),
                "total_num_tokens": torch.tensor(1024),
                "reward": np.float32(0.5),
                "lr": np.array([5e-6]),
                "is_done": True,
                "advantages": {"mean": 0.0, "max": 1.5},
            },
            step=3,
            prefix="train",
        )
        assert len(read_jsonl(tmp_path / METRICS_FILENAME)) == 1  # flushed per call, readable while running
        logger.log_metrics({"generation": 1.5}, step=3, prefix="timing/train/")
        logger.log_metrics({"train/loss": float("nan")}, step=4)
    rows = read_jsonl(tmp_path / METRICS_FILENAME)
    assert rows[0] == {
        "step": 3,
        "train/loss": 0.25,
        "train/total_num_tokens": 1024,
        "train/reward": 0.5,
        "train/lr": pytest.approx(5e-6),
        "train/is_done": 1,
        "train/advantages/mean": 0.0,
        "train/advantages/max": 1.5,
    }
    assert rows[0] == {"step": 3, **logged}
    assert isinstance(rows[0]["train/total_num_tokens"], int) and isinstance(rows[0]["train/loss"], float)
    assert rows[1] == {"step": 3, "timing/train/generation": 1.5}
    assert rows[2]["step"] == 4 and math.isnan(rows[2]["train/loss"])


def test_jsonl_appends_across_loggers_sharing_a_dir(tmp_path):
    for step in (1, 2):
        with quiet_logger(tmp_path) as logger:
            logger.log_metrics({"loss": float(step)}, step, prefix="train")
    assert read_jsonl(tmp_path / METRICS_FILENAME) == [{"step": 1, "train/loss": 1.0}, {"step": 2, "train/loss": 2.0}]


def test_non_scalars_are_skipped_with_one_warning_per_key(tmp_path, caplog):
    with quiet_logger(tmp_path) as logger, caplog.at_level(logging.WARNING):
        for step in range(3):
            logger.log_metrics({"loss": 1.0, "per_token": torch.ones(4), "name": "x", "none": None}, step, "train")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warnings) == [
        "log_metrics: skipping 'train/name': not a scalar (got str)",
        "log_metrics: skipping 'train/none': not a scalar (got NoneType)",
        "log_metrics: skipping 'train/per_token': not a scalar (got Tensor of shape (4,))",
    ]
    assert [set(row) for row in read_jsonl(tmp_path / METRICS_FILENAME)] == [{"step", "train/loss"}] * 3


@pytest.mark.parametrize(
    ("step", "error", "message"),
    [(-1, ValueError, "non-negative integer, got -1"), (1.5, TypeError, "got float 1.5"), (True, TypeError, "bool")],
)
def test_bad_step_is_rejected(tmp_path, step, error, message):
    with quiet_logger(tmp_path) as logger:
        with pytest.raises(error, match=message):
            logger.log_metrics({"loss": 1.0}, step)
        logger.log_metrics({"loss": 1.0}, np.int64(2))  # numpy integers are fine


def test_bad_metric_inputs_name_the_problem(tmp_path):
    with quiet_logger(tmp_path) as logger:
        with pytest.raises(ValueError, match="metric key 'step' is reserved"):
            logger.log_metrics({"step": 1}, 0)
        with pytest.raises(TypeError, match="key 3 under 'train' must be a non-empty string"):
            logger.log_metrics({3: 1.0}, 0, prefix="train")
        with pytest.raises(TypeError, match="metrics must be a mapping"):
            logger.log_metrics([("loss", 1.0)], 0)


# --- console -----------------------------------------------------------------------------------------------------


def test_console_table_groups_metrics_by_prefix_in_fixed_order(tmp_path):
    out = io.StringIO()
    cfg = LoggerConfig(monitor_gpus=False)
    with Logger(cfg, tmp_path, console=Console(file=out, width=100, color_system=None)) as logger:
        logger.log_metrics(
            {"performance/tokens_per_sec": 123.456789, "timing/train/generation": 2.0, "train/loss": 0.5}, step=7
        )
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["step", "7"]
    # groups in order train, validation, timing, performance, separated by blank lines; floats as %.6g
    assert [line.split() for line in lines[1:]] == [
        [],
        ["train", "loss", "0.5"],
        [],
        ["timing", "train/generation", "2"],
        [],
        ["performance", "tokens_per_sec", "123.457"],
        [],
    ]


def test_quiet_logger_prints_nothing(tmp_path, capsys):
    with quiet_logger(tmp_path) as logger:
        logger.log_metrics({"loss": 0.5}, 1, "train")
    assert capsys.readouterr().out == ""


# --- samples, hyperparams, lifecycle -----------------------------------------------------------------------------


def test_log_samples_jsonl_converts_tensors_and_uses_step_in_filename(tmp_path):
    rows = [
        {"prompt": "1+1=", "response": "2", "reward": torch.tensor(1.0), "advantage": np.float64(0.5)},
        {"prompt": "2+2=", "response": "5", "reward": 0.0, "token_ids": torch.tensor([[1, 2], [3, 4]])},
    ]
    with quiet_logger(tmp_path) as logger:
        path = logger.log_samples_jsonl(rows, step=12)
        custom = logger.log_samples_jsonl(rows[:1], step=12, filename="val/samples_{step}.jsonl")
    assert path == tmp_path / "train_data_step12.jsonl"
    assert read_jsonl(path) == [
        {"prompt": "1+1=", "response": "2", "reward": 1.0, "advantage": 0.5},
        {"prompt": "2+2=", "response": "5", "reward": 0.0, "token_ids": [[1, 2], [3, 4]]},
    ]
    assert custom == tmp_path / "val" / "samples_12.jsonl" and len(read_jsonl(custom)) == 1


def test_log_samples_jsonl_errors_name_row_and_key(tmp_path):
    with quiet_logger(tmp_path) as logger:
        with pytest.raises(TypeError, match=r"rows\[1\]\['meta'\] is not JSON-serialisable: object is not supported"):
            logger.log_samples_jsonl([{"a": 1}, {"a": 2, "meta": object()}], step=0)
        with pytest.raises(TypeError, match=r"rows\[0\] must be a mapping, got str"):
            logger.log_samples_jsonl(["prompt"], step=0)
        with pytest.raises(TypeError, match="rows must be a list of mappings, got dict"):
            logger.log_samples_jsonl({"a": 1}, step=0)
    assert not (tmp_path / "train_data_step0.jsonl").exists()


def test_log_hyperparams_flattens_with_dots(tmp_path):
    with quiet_logger(tmp_path) as logger:
        flat = logger.log_hyperparams({"policy": {"optimizer": {"kwargs": {"lr": 5e-6, "betas": [0.9, 0.999]}}}})
        assert flat == {"policy.optimizer.kwargs.lr": 5e-6, "policy.optimizer.kwargs.betas": [0.9, 0.999]}
        omegaconf_flat = logger.log_hyperparams(OmegaConf.create({"a": {"b": [1, 2], "c": None}}))
        assert omegaconf_flat == {"a.b": [1, 2], "a.c": None} and type(omegaconf_flat["a.b"]) is list
        assert logger.log_hyperparams(WandbConfig()) == {
            "project": "nemo-rl-clone",
            "name": "run",
            "mode": "offline",
            "entity": None,
        }
        with pytest.raises(TypeError, match="params must be a mapping or a dataclass, got list"):
            logger.log_hyperparams([1, 2])


def test_finish_is_idempotent_and_logging_after_it_fails(tmp_path):
    logger = quiet_logger(tmp_path, tensorboard_enabled=True)
    logger.finish()  # never logged anything
    logger.finish()
    with pytest.raises(RuntimeError, match=r"finish\(\) was already called"):
        logger.log_metrics({"loss": 1.0}, 0)


def test_invalid_wandb_mode_is_rejected_before_anything_starts(tmp_path):
    cfg = LoggerConfig(wandb_enabled=True, wandb=WandbConfig(mode="offfline"), monitor_gpus=False)
    with pytest.raises(ValueError, match=r"logger.wandb.mode must be one of \['online', 'offline', 'disabled'\]"):
        Logger(cfg, tmp_path)
    assert not (tmp_path / "wandb").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_monitor_gpus_without_cuda_notes_once_and_logs_only_given_metrics(tmp_path, caplog):
    with (
        caplog.at_level(logging.INFO, logger="nemo_rl_clone.utils.logger_backends"),
        Logger(LoggerConfig(monitor_gpus=True), tmp_path, quiet=True) as logger,
    ):
        logger.log_metrics({"loss": 1.0}, 0, "train")
        logger.log_metrics({"loss": 1.0}, 1, "train")
    notes = [r for r in caplog.records if "GPU monitoring is off" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO
    assert [set(row) for row in read_jsonl(tmp_path / METRICS_FILENAME)] == [{"step", "train/loss"}] * 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("collection_interval", "sampled_steps"), [(0.0, [0, 1]), (1e9, [0])])
def test_monitor_gpus_logs_gpu_metrics_once_per_step_at_most_every_collection_interval(
    tmp_path, collection_interval, sampled_steps
):
    pytest.importorskip("pynvml")
    cfg = LoggerConfig(monitor_gpus=True, gpu_monitoring=GpuMonitoringConfig(collection_interval=collection_interval))
    with Logger(cfg, tmp_path, quiet=True) as logger:
        logger.log_metrics({"loss": 1.0}, 0, "train")
        logger.log_metrics({"generation": 1.0}, 0, "timing/train")
        logger.log_metrics({"loss": 1.0}, 1, "train")
    gpu_rows = [row for row in read_jsonl(tmp_path / METRICS_FILENAME) if "gpu_monitoring/gpu0/memory_used_gib" in row]
    assert [row["step"] for row in gpu_rows] == sampled_steps
    assert all(0.0 <= row["gpu_monitoring/gpu0/utilization_pct"] <= 100.0 for row in gpu_rows)


# --- TensorBoard / MLflow / wandb read-back ----------------------------------------------------------------------


def test_tensorboard_scalars_and_hparams_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    with quiet_logger(tmp_path, tensorboard_enabled=True) as logger:
        logger.log_hyperparams({"grpo": {"seed": 42, "baseline": None}, "policy": {"model_name": "Qwen"}})
        for step, loss in [(1, 0.5), (2, 0.25)]:
            logger.log_metrics({"loss": loss}, step, prefix="train")
        logger.log_metrics({"accuracy": 0.75}, 2, prefix="validation")

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 0.5), (2, 0.25)]
    assert [(e.step, e.value) for e in events.Scalars("validation/accuracy")] == [(2, 0.75)]
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["grpo.seed"].number_value == 42
    assert hparams["grpo.baseline"].string_value == "null"
    assert hparams["policy.model_name"].string_value == "Qwen"


def test_mlflow_file_store_read_back_and_run_status(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = MLflowConfig(experiment_name="grpo-test", run_name="exp_1")
    with quiet_logger(tmp_path, mlflow_enabled=True, mlflow=cfg) as logger:
        logger.log_hyperparams({"policy": {"optimizer": {"kwargs": {"lr": 5e-6, "betas": [0.9, 0.999]}}}})
        for step, loss in [(1, 0.5), (2, 0.25)]:
            logger.log_metrics({"loss": loss, "advantages": {"mean": step}}, step, prefix="train")
    with pytest.raises(ZeroDivisionError), quiet_logger(tmp_path / "second", mlflow_enabled=True, mlflow=cfg):
        _ = 1 / 0

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("grpo-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "exp_1" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/advantages/mean")] == [1.0, 2.0]
    assert run.data.params == {"policy.optimizer.kwargs.lr": "5e-06", "policy.optimizer.kwargs.betas": "[0.9, 0.999]"}

    failed_store = MlflowClient(tracking_uri=(tmp_path / "second" / "mlruns").as_uri())
    (failed,) = failed_store.search_runs([failed_store.get_experiment_by_name("grpo-test").experiment_id])
    assert failed.info.status == "FAILED"


def read_wandb_records(path: Path) -> list:
    """Decodes a `.wandb` transaction log with wandb's own protobuf schema.

    The file is a 7-byte header (":W&B", magic, version) followed by LevelDB-log framing: 32 KiB blocks of
    records with a 7-byte header (crc32c, little-endian length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4).
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32 * 1024, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailers too short for a header are zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            records.append(wandb_internal_pb2.Record.FromString(pending))
    return records


def test_wandb_offline_run_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any network attempt would fail, not hang
    cfg = WandbConfig(project="nemo-rl-clone-test", name="exp_1", mode="offline")
    with quiet_logger(tmp_path, wandb_enabled=True, wandb=cfg) as logger:
        logger.log_hyperparams({"grpo": {"num_prompts_per_step": 32}})
        logger.log_metrics({"loss": 0.5}, 1, prefix="train")
        logger.log_metrics({"generation": 2.0}, 1, prefix="timing/train")
        logger.log_metrics({"loss": 0.25}, 2, prefix="train")

    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = read_wandb_records(run_file)
    deadline = time.monotonic() + 20  # wandb's service process may still be writing the log after finish()
    while not any(r.WhichOneof("record_type") == "run" for r in records) and time.monotonic() < deadline:
        time.sleep(0.5)
        records = read_wandb_records(run_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("nemo-rl-clone-test", "exp_1")
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
    assert history == [
        {"_step": 1, "train/loss": 0.5, "timing/train/generation": 2.0},
        {"_step": 2, "train/loss": 0.25},
    ]
    config_updates = {
        item.key or ".".join(item.nested_key): json.loads(item.value_json)
        for record in records
        if record.WhichOneof("record_type") == "config"
        for item in record.config.update
    }
    assert config_updates["grpo"] == {"num_prompts_per_step": 32}
