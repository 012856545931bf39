"""Experiment logging: console, `metrics.jsonl`, TensorBoard, wandb and MLflow behind one `Logger`.

Metric names follow NeMo-RL (`train/loss`, `validation/accuracy`, `timing/train/generation`,
`performance/tokens_per_sec`, ...): the caller passes the first component(s) as `prefix`.

Files written under the run's log dir:
- `metrics.jsonl`: one JSON object per `log_metrics` call, `{"step": 3, "train/loss": 0.41, ...}`.
- `train_data_step{N}.jsonl` (or another name): one JSON object per sample, see `log_samples_jsonl`.
- `plots/<name>_step{N}.png` for each `log_plot` figure.
- `tensorboard/`, `wandb/`, `mlruns/` when those backends are enabled.

NeMo-RL's calls work unchanged: ``Logger(config["logger"])`` (a plain dict), ``log_metrics(metrics, step, prefix,
step_metric)``, ``log_batched_dict_as_jsonl``, ``log_string_list_as_jsonl``, ``log_plot``, ``log_histogram``,
`flatten_dict`; its per-backend loggers, `print_message_log_samples` and `configure_rich_logging` load from
`nemo_rl_clone.utils.logger_faces` on first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
import numbers
import operator
import re
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from nemo_rl_clone.utils.config_validation import SectionReads, as_config, check_at_least
from nemo_rl_clone.utils.logger_backends import (
    ConsoleBackend,
    GpuMonitor,
    JsonlBackend,
    MetricsBackend,
    MlflowBackend,
    TensorboardBackend,
    WandbBackend,
    default_mlflow_tracking_uri,
)
from nemo_rl_clone.utils.samples import one_row_slices
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

log = logging.getLogger(__name__)

METRICS_FILENAME = "metrics.jsonl"


@dataclass
class WandbConfig(SectionReads):
    project: str = "nemo-rl-clone"  # the wandb project
    name: str = "run"  # the wandb run's name
    mode: str = "offline"  # online | offline | disabled
    entity: str | None = None  # the wandb team or user the run goes under (None: wandb's default)


@dataclass
class TensorboardConfig(SectionReads):
    # The event files' folder, relative to the run's log dir (an absolute path is used as is).
    log_dir: str = "tensorboard"


@dataclass
class SwanlabConfig(SectionReads):
    """SwanLab's run naming; refused through ``logger.swanlab_enabled`` (the swanlab package is not a dependency)."""

    project: str = "nemo-rl-clone"  # inert: SwanLab's project
    name: str = "run"  # inert: SwanLab's run name


@dataclass
class GpuMonitoringConfig(SectionReads):
    """``collection_interval``: the fewest seconds between two GPU samples (each is logged at the step it is taken
    in). ``flush_interval`` is NeMo-RL's period for writing buffered samples; samples here are written when taken,
    so there is nothing to buffer and any value does the same."""

    collection_interval: float = 10.0
    flush_interval: float = 10.0

    def check(self) -> list[tuple[str, str]]:
        return check_at_least(self, 0, "collection_interval", "flush_interval")


GPUMonitoringConfig = GpuMonitoringConfig  # NeMo-RL's spelling


@dataclass
class MLflowConfig(SectionReads):
    experiment_name: str = "nemo-rl-clone"  # the MLflow experiment (created if missing)
    run_name: str = "run"  # a new MLflow run's name
    tracking_uri: str | None = None  # None -> file store at <log_dir>/mlruns
    run_id: str | None = None  # an existing run to log into (resuming it) instead of a new one
    artifact_location: str | None = None  # where a new experiment stores its artifacts (None: the server's default)


@dataclass
class LoggerConfig(SectionReads):
    log_dir: str = "logs"  # each run logs into a fresh log_dir/exp_N
    num_val_samples_to_print: int = 0  # validation samples printed per validation (RL runs; others: only 0)
    wandb_enabled: bool = False  # log to wandb (logger.wandb), into exp_N/wandb
    tensorboard_enabled: bool = False  # write TensorBoard event files (logger.tensorboard)
    mlflow_enabled: bool = False  # log to MLflow (logger.mlflow)
    monitor_gpus: bool = True  # on GPU nodes: log each GPU's utilisation and memory (logger.gpu_monitoring)
    swanlab_enabled: bool = False  # refused when true
    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    mlflow: MLflowConfig = field(default_factory=MLflowConfig)
    swanlab: SwanlabConfig = field(default_factory=SwanlabConfig)
    gpu_monitoring: GpuMonitoringConfig = field(default_factory=GpuMonitoringConfig)

    def check(self) -> list[tuple[str, str]]:
        swanlab = "not supported yet: SwanLab logging (swanlab is not installed); use wandb_enabled, "
        return [("swanlab_enabled", swanlab + "tensorboard_enabled or mlflow_enabled")] if self.swanlab_enabled else []


def check_no_samples_to_print(logger: LoggerConfig | None, run: str) -> list[tuple[str, str]]:
    """``logger.num_val_samples_to_print`` prints GRPO's validation generations; other runs have none to print."""
    if logger is not None and logger.num_val_samples_to_print:
        return [
            (
                "logger.num_val_samples_to_print",
                f"only GRPO prints validation samples; {run} has none, set it to 0",
            )
        ]
    return []


def get_next_experiment_dir(base_log_dir: str | Path) -> Path:
    """Creates and returns `base_log_dir/exp_N`, N = 1 + the largest existing `exp_N` (`exp_1` in an empty dir).

    Safe against concurrent callers: the directory is created with `exist_ok=False`, and a caller that
    loses the race rescans and tries the next number.
    """
    base = Path(base_log_dir)
    base.mkdir(parents=True, exist_ok=True)
    for _ in range(1000):
        taken = [int(m.group(1)) for p in base.iterdir() if (m := re.fullmatch(r"exp_(\d+)", p.name))]
        candidate = base / f"exp_{max(taken, default=0) + 1}"
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"Could not create a fresh exp_N directory under {base} after 1000 attempts")


class Logger:
    """Fans metrics, hyperparameters and sample dumps out to the enabled backends.

    `cfg` is a `LoggerConfig` or NeMo-RL's plain ``logger`` dict. `log_dir` is the run's directory (already chosen,
    e.g. by `get_next_experiment_dir`); without it, `cfg.log_dir` (NeMo-RL's ``Logger(cfg)``). The console table
    can be silenced with `quiet=True` or redirected with `console`.
    Use as a context manager, or call `finish()` at the end (runs that raised are marked failed in
    wandb/MLflow when used as a context manager).
    """

    def __init__(
        self,
        cfg: LoggerConfig | Mapping[str, Any],
        log_dir: str | Path | None = None,
        *,
        quiet: bool = False,
        console: Console | None = None,
    ) -> None:
        cfg = as_config(cfg, LoggerConfig, key="logger")
        if cfg.wandb_enabled and cfg.wandb.mode not in WandbBackend.MODES:
            raise ValueError(f"logger.wandb.mode must be one of {list(WandbBackend.MODES)}, got {cfg.wandb.mode!r}")
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir if log_dir is None else log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base_log_dir = str(self.log_dir)  # NeMo-RL's attribute
        self._warned_keys: set[str] = set()
        self._failed_sinks: set[str] = set()
        self._finished = False
        self._last_gpu_step: int | None = None
        self._last_gpu_sample_time = -math.inf
        self._backends: list[MetricsBackend] = []
        self._gpu_monitor: GpuMonitor | None = None
        try:
            if not quiet:
                self._backends.append(ConsoleBackend(console))
            self._backends.append(JsonlBackend(self.log_dir / METRICS_FILENAME))
            if cfg.tensorboard_enabled:
                self._backends.append(TensorboardBackend(self.log_dir / cfg.tensorboard.log_dir))
            if cfg.wandb_enabled:
                wandb_cfg = cfg.wandb
                self._backends.append(
                    WandbBackend(self.log_dir, wandb_cfg.project, wandb_cfg.name, wandb_cfg.mode, wandb_cfg.entity)
                )
            if cfg.mlflow_enabled:
                mlflow = cfg.mlflow
                uri = mlflow.tracking_uri or default_mlflow_tracking_uri(self.log_dir)
                self._backends.append(
                    MlflowBackend(uri, mlflow.experiment_name, mlflow.run_name, mlflow.run_id, mlflow.artifact_location)
                )
            if cfg.monitor_gpus:
                self._gpu_monitor = GpuMonitor.create()
        except BaseException:
            with contextlib.suppress(Exception):  # keep the original error
                self.finish(failed=True)  # release the backends that did start
            raise
        log.info("Logging to %s (%s)", self.log_dir, ", ".join(type(b).__name__ for b in self._backends))

    def log_metrics(
        self,
        metrics: Mapping[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> dict[str, int | float]:
        """Logs scalar metrics at `step`; returns what was logged (full keys -> int/float).

        Keys become `"<prefix>/<key>"` (prefix "timing/train" -> "timing/train/generation"); nested
        mappings are joined with "/". The key named `step_metric` keeps its name unprefixed (NeMo-RL's wandb x-axis
        metric); every metric is still logged at `step`. `step_finished` (wandb's commit hint in NeMo-RL) changes
        nothing here: each call is written as it comes. Python/numpy/torch scalars and one-element arrays/tensors are
        accepted (integers stay int, the rest become float); other values are skipped with one warning
        per key. With `monitor_gpus` on a GPU node, the first call of a step also logs
        `gpu_monitoring/gpu{i}/{utilization_pct,memory_used_gib}` at that step, when at least
        `gpu_monitoring.collection_interval` seconds have passed since the last sample.
        """
        self._check_open()
        step = _check_step(step)
        if not isinstance(metrics, Mapping):
            raise TypeError(f"log_metrics: metrics must be a mapping of name -> scalar, got {type(metrics).__name__}")
        prefix = (prefix or "").strip("/")
        flat: dict[str, int | float] = {}
        unprefixed = f"{prefix}/{step_metric}" if prefix and step_metric else None
        for key, value in _flatten(metrics, prefix, "/"):
            key = step_metric if key == unprefixed and step_metric else key
            if key == "step":
                raise ValueError("log_metrics: metric key 'step' is reserved (use a prefix, e.g. prefix='train')")
            scalar = to_scalar(value)
            if scalar is None:
                if key not in self._warned_keys:
                    self._warned_keys.add(key)
                    log.warning("log_metrics: skipping %r: not a scalar (got %s)", key, _describe(value))
                continue
            flat[key] = scalar
        if flat:
            self._emit(flat, step)
        if self._gpu_monitor is not None and self._gpu_sample_due(step):
            self._last_gpu_step, self._last_gpu_sample_time = step, time.monotonic()
            self._emit({f"gpu_monitoring/{k}": v for k, v in self._gpu_monitor.sample().items()}, step)
        return flat

    def _gpu_sample_due(self, step: int) -> bool:
        """At most one GPU sample per step, and ``gpu_monitoring.collection_interval`` seconds apart."""
        elapsed = time.monotonic() - self._last_gpu_sample_time
        return step != self._last_gpu_step and elapsed >= self.cfg.gpu_monitoring.collection_interval

    def log_hyperparams(self, params: Mapping[str, Any] | Any) -> dict[str, Any]:
        """Logs a (nested) config; returns the flattened `{"a.b.c": value}` form given to TensorBoard/MLflow.

        Accepts a mapping or a dataclass instance; wandb receives the nested form.
        """
        self._check_open()
        if dataclasses.is_dataclass(params) and not isinstance(params, type):
            params = dataclasses.asdict(params)
        if not isinstance(params, Mapping):
            raise TypeError(f"log_hyperparams: params must be a mapping or a dataclass, got {type(params).__name__}")
        nested = _to_plain(params)
        flat = dict(_flatten(nested, "", "."))
        for backend in self._backends:
            backend.log_hyperparams(flat, nested)
        return flat

    def log_samples_jsonl(
        self, rows: Sequence[Mapping[str, Any]], step: int, filename: str = "train_data_step{step}.jsonl"
    ) -> Path:
        """Writes one JSON object per row to `log_dir/filename.format(step=step)` (overwritten) and returns the path.

        Rows are mappings such as `{"prompt": str, "response": str, "reward": float, "advantage": float}`;
        tensors and numpy arrays become (nested) lists, their scalars plain numbers.
        """
        self._check_open()
        step = _check_step(step)
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
            raise TypeError(f"log_samples_jsonl: rows must be a list of mappings, got {type(rows).__name__}")
        lines = []
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"log_samples_jsonl: rows[{index}] must be a mapping, got {type(row).__name__}")
            try:
                lines.append(json.dumps(dict(row), default=_json_default) + "\n")
            except (TypeError, ValueError):
                for key, value in row.items():  # find the offending key for the error message
                    try:
                        json.dumps(value, default=_json_default)
                    except (TypeError, ValueError) as error:
                        raise TypeError(
                            f"log_samples_jsonl: rows[{index}][{key!r}] is not JSON-serialisable: {error}"
                        ) from None
                raise
        path = self.log_dir / filename.format(step=step)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(lines), encoding="utf-8")
        except OSError as error:
            with contextlib.suppress(OSError):
                path.unlink()  # no half-written dump left to mislead the viewer
            self._write_failed("sample dump", step, error)
        else:
            self._failed_sinks.discard("sample dump")
        return path

    def log_batched_dict_as_jsonl(self, to_log: Mapping[str, Any], filename: str) -> Path:
        """Writes one JSON line per sample of a batch (a `BatchedDataDict` or a dict of equal-length columns) to
        `log_dir/filename` (overwritten), as NeMo-RL does: each value is that sample's one-row slice, plus ``idx``."""
        return self.log_samples_jsonl(
            one_row_slices(to_log), step=0, filename=filename.replace("{", "{{").replace("}", "}}")
        )

    def log_string_list_as_jsonl(self, to_log: Sequence[str], filename: str) -> Path:
        """Appends each string (already one JSON document) as a line of `log_dir/filename`."""
        self._check_open()
        if isinstance(to_log, str) or not all(isinstance(line, str) for line in to_log):
            raise TypeError("log_string_list_as_jsonl: to_log must be a list of str")
        path = self.log_dir / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in to_log)
        return path

    def log_plot(self, figure: Any, step: int, name: str) -> Path:
        """Saves a matplotlib figure as `log_dir/plots/<name>_step<step>.png` (returned) and sends it to the
        TensorBoard, wandb and MLflow backends that are enabled."""
        self._check_open()
        step = _check_step(step)
        path = self.log_dir / "plots" / f"{name}_step{step}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, bbox_inches="tight")
        for backend in self._backends:
            if hasattr(backend, "log_plot"):
                backend.log_plot(figure, step, name)
        return path

    def log_histogram(self, histogram: Sequence[float] | torch.Tensor | np.ndarray, step: int, name: str) -> None:
        """Sends the values' histogram to the TensorBoard and wandb backends that are enabled (the console, JSONL
        and MLflow sinks have no histogram type; NeMo-RL's TensorBoard and MLflow loggers skip histograms too)."""
        self._check_open()
        step = _check_step(step)
        values = np.asarray(histogram.detach().cpu() if isinstance(histogram, torch.Tensor) else histogram, float)
        for backend in self._backends:
            if hasattr(backend, "log_histogram"):
                backend.log_histogram(values, step, name)

    def finish(self, failed: bool = False) -> None:
        """Closes every backend (idempotent). All backends are closed even if one fails; the first error is raised."""
        if self._finished:
            return
        self._finished = True
        errors: list[BaseException] = []
        for backend in self._backends:
            try:
                backend.finish(failed)
            except Exception as error:
                errors.append(error)
        if self._gpu_monitor is not None:
            self._gpu_monitor.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> Logger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.finish(failed=exc_type is not None)

    def _emit(self, flat: dict[str, int | float], step: int) -> None:
        for backend in self._backends:
            try:
                backend.log_metrics(flat, step)
            except OSError as error:  # a full disk or a lost mount: the run goes on, the sink reports once
                self._write_failed(type(backend).__name__, step, error)
            else:
                self._failed_sinks.discard(type(backend).__name__)

    def _write_failed(self, sink: str, step: int, error: OSError) -> None:
        """One warning line per sink and failure streak; the sink tries again on the next write."""
        if sink not in self._failed_sinks:
            self._failed_sinks.add(sink)
            log.warning(
                "logger: %s could not write step %d under %s (%s); the run goes on, and this sink's writes are lost "
                "until the error clears",
                sink,
                step,
                self.log_dir,
                error,
            )

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("Logger.finish() was already called; create a new Logger to log more")


def to_scalar(value: Any) -> int | float | None:
    """int/float for Python, numpy and torch scalars (and one-element arrays/tensors); None otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        value = value.item()
    elif isinstance(value, (np.ndarray, np.generic)):
        if value.size != 1 or np.iscomplexobj(value):
            return None
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def flatten_dict(d: Mapping[str, Any], sep: str = ".", expand_lists: bool = True) -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [2, {"d": 3}]}`` -> ``{"a.b": 1, "c.0": 2, "c.1.d": 3}``; with ``expand_lists``
    False lists stay whole (``"c": [...]``)."""
    return dict(_flatten(d, "", sep, expand_lists))


def _flatten(tree: Mapping[str, Any], prefix: str, sep: str, expand_lists: bool = False) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"key {key!r} under {prefix or 'the top level'!r} must be a non-empty string")
        full = f"{prefix}{sep}{key}" if prefix else key
        if isinstance(value, Mapping):
            items.extend(_flatten(value, full, sep, expand_lists))
        elif expand_lists and isinstance(value, list):
            items.extend(_flatten({str(i): item for i, item in enumerate(value)}, full, sep, expand_lists))
        else:
            items.append((full, value))
    return items


def _to_plain(value: Any) -> Any:
    """Nested mappings/sequences (e.g. OmegaConf nodes) as plain dicts/lists, which every backend accepts."""
    if isinstance(value, Mapping):
        return {key: _to_plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_to_plain(item) for item in value]
    return value


def _check_step(step: Any) -> int:
    if isinstance(step, bool):
        raise TypeError("step must be a non-negative integer, got a bool")
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be a non-negative integer, got {type(step).__name__} {step!r}") from None
    if step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step}")
    return step


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"{type(value).__name__} of shape {tuple(shape)}" if shape is not None else type(value).__name__


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not supported (use str, numbers, lists, dicts, tensors or arrays)")


# NeMo-RL's names beyond `Logger`: loaded on first use (their module imports this one), or refused by name
_FACES = {"LoggerInterface", "TensorboardLogger", "WandbLogger", "MLflowLogger", "GpuMetricSnapshot"}
_FACES |= {"configure_rich_logging", "print_message_log_samples"}
_SWANLAB = "SwanLab logging (swanlab is not installed); use wandb, TensorBoard or MLflow"
_RAY_GPUS = "GPU metrics of every Ray node from Ray's metrics endpoints (logger.monitor_gpus samples this node's GPUs)"
_refused = refusing_getattr(__name__, {"SwanlabLogger": _SWANLAB, "RayGpuMonitorLogger": _RAY_GPUS})


def __getattr__(name: str) -> Any:
    if name in _FACES:
        return getattr(importlib.import_module("nemo_rl_clone.utils.logger_faces"), name)
    return _refused(name)
