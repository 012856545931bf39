"""NeMo-RL v0.7.0's names of ``nemo_rl.utils.logger`` (per-backend loggers, GPU monitoring config, rich logging)
and of the other modules of this round, at our paths, with NeMo-RL's behaviour on tiny inputs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nemo_rl_clone.utils import logger as nemo_logger
from nemo_rl_clone.utils.unsupported_modules import UnsupportedFeatureError


def _tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_logger_writes_prefixed_scalars_to_event_files(tmp_path, caplog):
    tb = nemo_logger.TensorboardLogger({"log_dir": "unread"}, log_dir=tmp_path / "tb")  # a Path or a str
    with caplog.at_level(logging.WARNING):
        tb.log_metrics({"loss": 0.5, "tokens": 3, "per_sample": [1, 2]}, step=2, prefix="train", step_metric="tokens")
    tb.log_metrics({"accuracy": 0.25}, step=4)  # no prefix: the key as is
    tb.finish()
    # every key is prefixed (step_metric is wandb's), the list is skipped with a warning naming it
    assert _tensorboard_scalars(tmp_path / "tb") == {
        "train/loss": [(2, 0.5)],
        "train/tokens": [(2, 3.0)],
        "accuracy": [(4, 0.25)],
    }
    assert "train/per_sample" in caplog.text
    assert isinstance(tb, nemo_logger.LoggerInterface)


def test_tensorboard_logger_takes_a_str_log_dir_and_hyperparams_nested(tmp_path):
    tb = nemo_logger.TensorboardLogger({}, log_dir=str(tmp_path))
    tb.log_hyperparams({"policy": {"lr": 1e-5}, "stops": ["a", "b"]})
    tb.log_histogram([1.0, 2.0, 2.0], step=1, name="rewards")
    tb.finish()
    tb.finish()  # idempotent
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_mlflow_logger_flattens_summarises_lists_and_names_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    mlflow_logger = nemo_logger.MLflowLogger({"experiment_name": "exp", "run_name": "r1"}, log_dir=tmp_path)
    mlflow_logger.log_metrics({"a": {"b": 2}, "lens": [1, 2, 3, 4]}, step=3, prefix="train")
    mlflow_logger.log_hyperparams({"policy": {"lr": 0.5}, "stops": ["x"]})
    mlflow_logger.finish()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.get_run(mlflow_logger.run_id)
    # mean 2.5; p50 2.5; p90 of [1, 2, 3, 4]: 3 + 0.7 * (4 - 3) = 3.7; max 4
    assert run.data.metrics == pytest.approx(
        {"train/a/b": 2.0, "train/lens/mean": 2.5, "train/lens/p50": 2.5, "train/lens/p90": 3.7, "train/lens/max": 4.0}
    )
    assert run.data.params == {"policy.lr": "0.5", "stops.0": "x"}
    assert (run.info.run_name, run.info.status) == ("r1", "FINISHED")
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_mlflow_logger_reads_nemo_rl_environment_variables(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "store").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 refuses a file store without it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from_env")
    mlflow_logger = nemo_logger.MLflowLogger({}, log_dir=None)
    mlflow_logger.finish()
    run = MlflowClient(tracking_uri=uri).get_run(mlflow_logger.run_id)
    assert MlflowClient(tracking_uri=uri).get_experiment(run.info.experiment_id).name == "from_env"


class _RecordingRun:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, dict]] = []

    def log(self, data: dict, **kwargs) -> None:
        self.calls.append((data, kwargs))


def test_wandb_logger_keeps_the_step_metric_unprefixed_and_logs_against_it(tmp_path):
    wandb_logger = nemo_logger.WandbLogger({"project": "p", "name": "n", "mode": "disabled"}, log_dir=tmp_path)
    recording = _RecordingRun()
    wandb_logger._sink.run = recording
    wandb_logger.log_metrics({"util": 0.5, "ray/ray_step": 7}, step=1, prefix="ray", step_metric="ray/ray_step")
    wandb_logger.log_metrics({"loss": 1.0}, step=2, prefix="train", step_finished=True)
    wandb_logger.log_metrics({"loss": 1.5}, step=3, prefix="train")
    assert recording.calls == [
        ({"ray/util": 0.5, "ray/ray_step": 7}, {"commit": False}),  # against the step metric, not step 1
        ({"train/loss": 1.0}, {"step": 2, "commit": True}),
        ({"train/loss": 1.5}, {"step": 3}),
    ]


def test_wandb_logger_refuses_an_unknown_mode_in_one_line():
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode must be one of"):
        nemo_logger.WandbLogger({"mode": "sometimes"})


def test_swanlab_logger_is_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match=r"utils\.logger\.SwanlabLogger: not supported yet: SwanLab"):
        nemo_logger.SwanlabLogger  # noqa: B018
    with pytest.raises(UnsupportedFeatureError, match=r"RayGpuMonitorLogger: not supported yet: GPU metrics of every"):
        nemo_logger.RayGpuMonitorLogger  # noqa: B018
    with pytest.raises(AttributeError):
        nemo_logger.NoSuchLogger  # noqa: B018


def test_logger_is_a_logger_interface_and_the_interface_is_abstract(tmp_path):
    with nemo_logger.Logger({"log_dir": str(tmp_path), "monitor_gpus": False}, quiet=True) as run_logger:
        assert isinstance(run_logger, nemo_logger.LoggerInterface)
    with pytest.raises(TypeError):
        nemo_logger.LoggerInterface()  # type: ignore[abstract]


def test_gpu_monitoring_config_and_snapshot_have_nemo_rl_fields():
    config = nemo_logger.GPUMonitoringConfig(collection_interval=5, flush_interval=2)
    assert (config.collection_interval, config.flush_interval) == (5, 2)
    assert nemo_logger.GpuMetricSnapshot.__annotations__.keys() == {"step", "metrics"}


def test_configure_rich_logging_installs_one_rich_handler_once(monkeypatch):
    from rich.logging import RichHandler

    from nemo_rl_clone.utils import logger_faces

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(logger_faces, "_rich_logging_configured", False)
    nemo_logger.configure_rich_logging(level="warning", show_time=False)
    nemo_logger.configure_rich_logging(level="DEBUG")  # a second call changes nothing
    assert [type(h) for h in root.handlers] == [RichHandler]
    assert root.level == logging.WARNING


# ---------------------------------------------------------------- nemo_rl.distributed.ray_actor_environment_registry
def _registry_values(environ: dict[str, str]) -> list[str]:
    """The registry's constants in a fresh interpreter (they are read from the environment at import)."""
    import os
    import subprocess
    import sys

    code = (
        "from nemo_rl_clone.distributed import ray_actor_environment_registry as r\n"
        "print(r.USE_SYSTEM_EXECUTABLE, repr(r.VLLM_EXECUTABLE), repr(r.MCORE_EXECUTABLE), sep='|')"
    )
    env = {**os.environ, **environ}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip().split("|")


def test_executables_are_the_uv_environments_unless_nemo_rl_system_switch_is_set():
    import sys

    from nemo_rl_clone.distributed.ray_actor_environment import PY_EXECUTABLES

    assert _registry_values({"NEMO_RL_PY_EXECUTABLES_SYSTEM": "0"}) == [
        "False",
        repr(PY_EXECUTABLES.VLLM),
        repr(PY_EXECUTABLES.MCORE),
    ]
    # "1" only, as NeMo-RL reads it: the driver's interpreter for every actor
    assert _registry_values({"NEMO_RL_PY_EXECUTABLES_SYSTEM": "1"}) == [
        "True",
        repr(sys.executable),
        repr(sys.executable),
    ]
    assert _registry_values({"NEMO_RL_PY_EXECUTABLES_SYSTEM": "true"})[0] == "False"


def test_sglang_executable_is_refused_by_name():
    from nemo_rl_clone.distributed import ray_actor_environment_registry as registry

    with pytest.raises(UnsupportedFeatureError, match=r"registry\.SGLANG_EXECUTABLE: not supported yet: the SGLang"):
        registry.SGLANG_EXECUTABLE  # noqa: B018


# ---------------------------------------------------------------- nemo_rl.distributed.virtual_cluster
def test_nvlink_topology_names_and_the_refused_bundle_probe():
    from nemo_rl_clone.distributed import virtual_cluster

    assert (virtual_cluster.TOPO_RANK_KEY, virtual_cluster.NVLINK_DOMAIN_PREFIX) == ("topo_rank", "nvlink_domain_")
    with pytest.raises(UnsupportedFeatureError, match=r"get_reordered_bundle: not supported yet: per-bundle GPU-id"):
        virtual_cluster.get_reordered_bundle  # noqa: B018
    assert virtual_cluster.RayVirtualCluster  # the built names stay readable
    with pytest.raises(UnsupportedFeatureError, match=r"DEFAULT_GYM_PORT_RANGE_LOW: not supported yet: NeMo-Gym"):
        virtual_cluster.DEFAULT_GYM_PORT_RANGE_LOW  # noqa: B018


# ---------------------------------------------------------------- nemo_rl.models.megatron.community_import, nemo_rl
def test_import_model_from_hf_name_is_refused_by_name():
    from nemo_rl_clone.models.megatron import community_import

    with pytest.raises(UnsupportedFeatureError, match=r"import_model_from_hf_name: not supported yet: importing a Hug"):
        community_import.import_model_from_hf_name  # noqa: B018
    assert callable(community_import.export_model_from_megatron)


def test_patch_transformers_module_dir_prepends_hf_home_modules(tmp_path, monkeypatch):
    import nemo_rl_clone

    monkeypatch.delenv("HF_HOME", raising=False)
    env = {"PYTHONPATH": "/a"}
    assert nemo_rl_clone.patch_transformers_module_dir(env) is env and env == {"PYTHONPATH": "/a"}
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert nemo_rl_clone.patch_transformers_module_dir({}) == {}  # no modules folder yet: unchanged
    (tmp_path / "modules").mkdir()
    assert nemo_rl_clone.patch_transformers_module_dir(env) == {"PYTHONPATH": f"{tmp_path}/modules:/a"}
    assert nemo_rl_clone.patch_transformers_module_dir({}) == {"PYTHONPATH": f"{tmp_path}/modules"}


def test_master_port_band_is_nemo_rl_and_below_the_ephemeral_ports():
    from nemo_rl_clone.distributed import virtual_cluster

    # a cluster built without a range picks its rendezvous ports here (tests/unit/test_virtual_cluster.py checks one)
    assert (virtual_cluster.DEFAULT_MASTER_PORT_RANGE_LOW, virtual_cluster.DEFAULT_MASTER_PORT_RANGE_HIGH) == (
        25000,
        28000,
    )
    assert virtual_cluster.DEFAULT_MASTER_PORT_RANGE_HIGH < 32768  # Linux's first ephemeral port
