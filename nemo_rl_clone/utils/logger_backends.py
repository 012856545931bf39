"""Metric sinks used by `nemo_rl_clone.utils.logger.Logger`.

Every backend receives already-flattened metrics (`{"train/loss": 0.5, ...}` of int/float) and flattened
hyperparameters (`{"policy.optimizer.kwargs.lr": 5e-6, ...}`). Heavy third-party imports (wandb, mlflow,
tensorboard) happen inside the constructors so that disabled backends cost nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rich import box
from rich.console import Console
from rich.table import Table

log = logging.getLogger(__name__)

Scalar = int | float

# Console groups, in display order; other groups follow in order of appearance.
_CONSOLE_GROUP_ORDER = ("train", "validation", "timing", "performance")


class MetricsBackend(Protocol):
    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None: ...

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None: ...

    def finish(self, failed: bool) -> None: ...


def param_to_scalar_or_str(value: Any) -> int | float | bool | str:
    """Hyperparameter value as a type every backend accepts; lists/None/dicts become JSON text."""
    if isinstance(value, (bool, int, float, str)):
        return value
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


class ConsoleBackend:
    """Prints one compact rich table per `log_metrics` call, rows grouped by the first key component."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()

    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None:
        groups: dict[str, list[tuple[str, Scalar]]] = {}
        for key, value in metrics.items():
            group, _, name = key.partition("/")
            groups.setdefault(group if name else "", []).append((name or key, value))
        ordered = sorted(groups, key=lambda g: _CONSOLE_GROUP_ORDER.index(g) if g in _CONSOLE_GROUP_ORDER else 99)

        table = Table(title=f"step {step}", title_justify="left", show_header=False, box=box.SIMPLE, pad_edge=False)
        table.add_column("group", style="bold cyan")
        table.add_column("metric")
        table.add_column("value", justify="right", style="green")
        for index, group in enumerate(ordered):
            if index > 0:
                table.add_section()
            for row, (name, value) in enumerate(groups[group]):
                table.add_row(group if row == 0 else "", name, format_value(value))
        self.console.print(table)

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        pass  # the resolved config is printed by the config loader

    def finish(self, failed: bool) -> None:
        pass


def format_value(value: Scalar) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


class JsonlBackend:
    """Appends `{"step": int, "<prefix>/<name>": value, ...}` per call to a JSONL file, one whole line per write.

    Append mode keeps earlier lines when a resumed run reuses the log dir. NaN/inf are written as the
    JavaScript literals `NaN`/`Infinity` (Python's json reads them back), so a diverged loss stays visible.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None:
        line = (json.dumps({"step": step, **metrics}) + "\n").encode()
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({written} of {len(line)} bytes written)")
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)  # a whole line or none: readers never meet half a record
            raise

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        pass

    def finish(self, failed: bool) -> None:
        os.close(self._fd)


class TensorboardBackend:
    """Scalars via `torch.utils.tensorboard.SummaryWriter`; hyperparameters in the HParams tab."""

    def __init__(self, log_dir: Path | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=None if log_dir is None else str(log_dir))  # None: runs/<time>_<host>
        self.log_dir = Path(self._writer.log_dir)

    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()  # a crashed run still shows everything logged before the crash

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        hparams = {key: param_to_scalar_or_str(value) for key, value in flat_params.items()}
        # run_name="." keeps the hparams event file in the same run dir as the scalars (the default would
        # create a timestamped sub-run that TensorBoard lists as a separate run).
        self._writer.add_hparams(hparams, {}, run_name=".")

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        self._writer.add_figure(name, figure, global_step=step, close=False)
        self._writer.flush()

    def log_histogram(self, values: Any, step: int, name: str) -> None:
        self._writer.add_histogram(name, values, global_step=step)
        self._writer.flush()

    def finish(self, failed: bool) -> None:
        self._writer.close()


class WandbBackend:
    """A wandb run under `dir`; mode "offline" writes `dir/wandb/offline-run-*` and never touches the network."""

    MODES = ("online", "offline", "disabled")

    def __init__(self, run_dir: Path, project: str, name: str, mode: str, entity: str | None = None) -> None:
        import wandb

        self.run = wandb.init(dir=str(run_dir), project=project, name=name, mode=mode, entity=entity)  # type: ignore[arg-type]  # one of MODES, checked by Logger

    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)  # wandb shows nesting natively

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        import wandb

        self.run.log({name: wandb.Image(figure)}, step=step)

    def log_histogram(self, values: Any, step: int, name: str) -> None:
        import wandb

        self.run.log({name: wandb.Histogram(values)}, step=step)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowBackend:
    """An MLflow run through `MlflowClient` (no global "active run" state).

    ``run_id``: log into that existing run (it must exist) instead of creating one; ``artifact_location``: where the
    experiment, when this creates it, stores artifacts."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        run_name: str,
        run_id: str | None = None,
        artifact_location: str | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=tracking_uri)
        if run_id is not None:
            self.run_id: str = self._client.get_run(run_id).info.run_id  # raises naming the id when absent
            self._client.update_run(self.run_id, status="RUNNING")
            return
        experiment_id = self._experiment_id(experiment_name, artifact_location)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def _experiment_id(self, experiment_name: str, artifact_location: str | None) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(experiment_name)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(self._client.create_experiment(experiment_name, artifact_location=artifact_location))
        except MlflowException:  # created concurrently by another run
            concurrent = self._client.get_experiment_by_name(experiment_name)
            if concurrent is None:
                raise
            return str(concurrent.experiment_id)

    def log_metrics(self, metrics: Mapping[str, Scalar], step: int) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        now_ms = int(time.time() * 1000)
        entries = [Metric(key, float(value), now_ms, step) for key, value in metrics.items()]
        for start in range(0, len(entries), MAX_METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=entries[start : start + MAX_METRICS_PER_BATCH])

    def log_hyperparams(self, flat_params: Mapping[str, Any], params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        entries = [
            Param(key, str(param_to_scalar_or_str(value))[:MAX_PARAM_VAL_LENGTH]) for key, value in flat_params.items()
        ]
        for start in range(0, len(entries), MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(self.run_id, params=entries[start : start + MAX_PARAMS_TAGS_PER_BATCH])

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        self._client.log_figure(self.run_id, figure, f"plots/{name}_step{step}.png")

    def finish(self, failed: bool) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def default_mlflow_tracking_uri(log_dir: Path) -> str:
    """File store at `log_dir/mlruns` (mlflow-skinny has no SQL backend)."""
    # MLflow >= 3.7 refuses the file store unless this is set; an explicit user setting wins.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (log_dir / "mlruns").resolve().as_uri()


class GpuMonitor:
    """Utilisation and memory of every NVIDIA GPU on this (the driver's) node, read through NVML.

    NVML sees all GPUs of the node, including those used by Ray workers, without creating a CUDA context.
    Other nodes of a multi-node cluster are not covered.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    @classmethod
    def create(cls) -> GpuMonitor | None:
        """A monitor, or None (noted once at INFO level) when there is no CUDA GPU or no NVML binding."""
        import torch

        if not torch.cuda.is_available():
            log.info("logger.monitor_gpus: no CUDA device on this machine, GPU monitoring is off")
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml)
        except Exception as error:  # ImportError, or NVMLError when the driver library is unusable
            log.info("logger.monitor_gpus: NVML unavailable (%s; install nvidia-ml-py), GPU monitoring is off", error)
            return None

    def sample(self) -> dict[str, float]:
        """`{"gpu{i}/utilization_pct": ..., "gpu{i}/memory_used_gib": ...}` for every GPU of the node."""
        metrics: dict[str, float] = {}
        for index, handle in enumerate(self._handles):
            utilization = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            metrics[f"gpu{index}/utilization_pct"] = float(utilization.gpu)
            metrics[f"gpu{index}/memory_used_gib"] = memory.used / 2**30
        return metrics

    def close(self) -> None:
        self._nvml.nvmlShutdown()
