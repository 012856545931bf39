"""NeMo-RL's per-backend loggers (``nemo_rl.utils.logger``'s `TensorboardLogger`, `WandbLogger`, `MLflowLogger` and
their `LoggerInterface`), each a thin face on one of our metric sinks (`nemo_rl_clone.utils.logger_backends`).

They take NeMo-RL's ``(cfg, log_dir=None)`` (``cfg``: the backend's section, a dict or our config) and NeMo-RL's
``log_metrics(metrics, step, prefix, step_metric, step_finished)``: each key is written as ``<prefix>/<key>``, a value
that is not a scalar is skipped with one warning. `Logger`, which fans out to all of them, stays the way most code
logs; these are for code that builds one backend itself. Read through ``nemo_rl_clone.utils.logger``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.logger import (
    Logger,
    MLflowConfig,
    WandbConfig,
    flatten_dict,
    to_scalar,
)
from nemo_rl_clone.utils.logger_backends import (
    MlflowBackend,
    TensorboardBackend,
    WandbBackend,
    default_mlflow_tracking_uri,
)
from nemo_rl_clone.utils.samples import print_samples, sample_rows

log = logging.getLogger(__name__)


class LoggerInterface(ABC):
    """What every NeMo-RL logger backend (and `Logger`, registered as one) does."""

    @abstractmethod
    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> Any:
        """Log scalar metrics at ``step``, each named ``<prefix>/<key>``."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> Any:
        """Log a (nested) config."""

    @abstractmethod
    def log_histogram(self, histogram: list[Any], step: int, name: str) -> Any:
        """Log the histogram of ``histogram``'s values at ``step``."""

    @abstractmethod
    def log_plot(self, figure: Any, step: int, name: str) -> Any:
        """Log a matplotlib figure at ``step``."""


LoggerInterface.register(Logger)  # NeMo-RL's Logger is a LoggerInterface; ours fans out to the same backends


class _SinkLogger(LoggerInterface):
    """A NeMo-RL backend logger over one of our sinks, closed by `finish` (or when garbage-collected, as NeMo-RL's)."""

    _sink: TensorboardBackend | WandbBackend | MlflowBackend

    def _scalars(self, metrics: Mapping[str, Any], prefix: str | None, keep: str | None = None) -> dict[str, Any]:
        """``<prefix>/<key>`` → int/float; the key ``keep`` (wandb's step metric) stays unprefixed."""
        scalars = {}
        for key, value in metrics.items():
            name = f"{prefix}/{key}" if prefix and key != keep else key
            scalar = to_scalar(value)
            if scalar is None:
                log.warning(
                    "%s: skipping metric %r: not a scalar (%s)", type(self).__name__, name, type(value).__name__
                )
                continue
            scalars[name] = scalar
        return scalars

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The config, flattened to ``a.b.c`` keys (lists by index, ``a.0``) where the backend has no nesting."""
        self._sink.log_hyperparams(flatten_dict(params), params)

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        self._sink.log_plot(figure, step, name)

    def finish(self, failed: bool = False) -> None:
        """Close the backend's run or files (idempotent)."""
        sink = self.__dict__.pop("_sink", None)
        if sink is not None:
            sink.finish(failed)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the backend may be half torn down
            self.finish()


class TensorboardLogger(_SinkLogger):
    """TensorBoard event files in ``log_dir`` (None: TensorBoard's default, ``runs/<time>_<host>``); ``cfg`` is
    accepted and unread, as in NeMo-RL (its folder is chosen by `Logger`)."""

    _sink: TensorboardBackend

    def __init__(self, cfg: Mapping[str, Any] | Any, log_dir: str | Path | None = None) -> None:
        self._sink = TensorboardBackend(None if log_dir is None else Path(log_dir))

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Every key, ``step_metric``'s included, is prefixed; ``step_metric`` and ``step_finished`` are wandb's."""
        self._sink.log_metrics(self._scalars(metrics, prefix), step)

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        """Written as a TensorBoard histogram (NeMo-RL's TensorboardLogger drops histograms)."""
        self._sink.log_histogram(np.asarray(histogram, dtype=float), step, name)


class WandbLogger(_SinkLogger):
    """A wandb run in ``log_dir`` from ``cfg`` (NeMo-RL's ``logger.wandb`` keys: project, name, entity, and our
    mode, offline unless set, as everywhere in this library). NeMo-RL's upload of the git tree and diffs is not done."""

    _sink: WandbBackend

    def __init__(self, cfg: Mapping[str, Any] | WandbConfig, log_dir: str | Path | None = None) -> None:
        wandb_cfg = as_config(cfg, WandbConfig, key="logger.wandb")
        if wandb_cfg.mode not in WandbBackend.MODES:
            raise ValueError(f"logger.wandb.mode must be one of {list(WandbBackend.MODES)}, got {wandb_cfg.mode!r}")
        run_dir = Path(log_dir) if log_dir is not None else Path.cwd()
        self._sink = WandbBackend(run_dir, wandb_cfg.project, wandb_cfg.name, wandb_cfg.mode, wandb_cfg.entity)

    @property
    def run(self) -> Any:
        """The wandb run (NeMo-RL's attribute)."""
        return self._sink.run

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        """Plot metrics matching ``name`` (a pattern such as ``"ray/*"``) against ``step_metric``."""
        self.run.define_metric(name, step_metric=step_metric)

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """With ``step_metric`` among the metrics, they are logged against it (not at ``step``, as in NeMo-RL);
        ``step_finished`` commits the step."""
        scalars = self._scalars(metrics, prefix, keep=step_metric)
        if step_metric and step_metric in scalars:
            self.run.log(scalars, commit=False)
        elif step_finished:
            self.run.log(scalars, step=step, commit=True)
        else:
            self.run.log(scalars, step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The nested config (wandb shows nesting)."""
        self._sink.log_hyperparams({}, dict(params))

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        """A wandb histogram; values all equal (no finite bins) log the value itself, as NeMo-RL does."""
        values = np.asarray(histogram, dtype=float)
        try:
            self._sink.log_histogram(values, step, name)
        except ValueError:
            self.run.log({name: float(values[0]) if values.size else 0.0}, step=step)


class MLflowLogger(_SinkLogger):
    """An MLflow run from ``cfg`` (NeMo-RL's ``logger.mlflow`` keys, each falling back to NeMo-RL's environment
    variable: ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_NAME``). Without a
    tracking URI the runs go to a file store at ``<log_dir or the working directory>/mlruns``; a new experiment
    stores its artifacts at ``artifact_location``, else ``log_dir``. No experiment name: MLflow's ``Default``."""

    _sink: MlflowBackend

    def __init__(self, cfg: Mapping[str, Any] | MLflowConfig, log_dir: str | Path | None = None) -> None:
        get = dict(cfg).get if isinstance(cfg, Mapping) else lambda key: getattr(cfg, key, None)
        base = Path(log_dir) if log_dir is not None else Path.cwd()
        uri = get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or default_mlflow_tracking_uri(base)
        self._sink = MlflowBackend(
            uri,
            get("experiment_name") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default",
            get("run_name") or os.environ.get("MLFLOW_RUN_NAME"),  # type: ignore[arg-type]  # None: MLflow names it
            get("run_id") or os.environ.get("MLFLOW_RUN_ID"),
            get("artifact_location") or (None if log_dir is None else str(log_dir)),
        )
        self.run_id = self._sink.run_id

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Nested keys join with ``/``; a list becomes its ``/mean``, ``/p50``, ``/p90`` and ``/max`` (MLflow keeps
        scalars only)."""
        flat: dict[str, Any] = {}
        for key, value in flatten_dict(metrics, sep="/", expand_lists=False).items():
            if isinstance(value, list | tuple):
                flat.update({f"{key}/{stat}": v for stat, v in _list_summary(value).items()})
            else:
                flat[key] = value
        self._sink.log_metrics(self._scalars(flat, prefix), step)

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        """Nothing is written: MLflow has no histogram type (NeMo-RL's MLflowLogger writes none either)."""


def _list_summary(values: Sequence[Any]) -> dict[str, float]:
    scalars = [to_scalar(v) for v in values if not isinstance(v, bool)]
    array = np.asarray([v for v in scalars if v is not None], dtype=np.float64)
    if not array.size:
        return {}
    p50, p90 = np.percentile(array, [50, 90])
    return {"mean": float(array.mean()), "p50": float(p50), "p90": float(p90), "max": float(array.max())}


class GpuMetricSnapshot(TypedDict):
    """One GPU sample as NeMo-RL's Ray GPU monitor buffers it: the seconds since monitoring started, and the values."""

    step: int
    metrics: dict[str, Any]


_rich_logging_configured = False


def configure_rich_logging(level: str = "INFO", show_time: bool = True, show_path: bool = True) -> None:
    """Route the root logger through rich's handler (coloured levels, readable tracebacks), once per process: later
    calls change nothing, as in NeMo-RL."""
    global _rich_logging_configured
    if _rich_logging_configured:
        return
    from rich.logging import RichHandler

    handler = RichHandler(rich_tracebacks=True, show_time=show_time, show_path=show_path, markup=True)
    logging.basicConfig(level=level.upper(), format="%(message)s", datefmt="[%X]", handlers=[handler])
    _rich_logging_configured = True


def print_message_log_samples(
    message_logs: Sequence[Sequence[Mapping[str, Any]]], rewards: Sequence[float], num_samples: int = 5, step: int = 0
) -> None:
    """Prints up to ``num_samples`` conversations with their rewards: when there are more, the best and the worst
    half each (and the median one for an odd count), so both ends of the reward range show."""
    if len(message_logs) != len(rewards):
        raise ValueError(f"print_message_log_samples: {len(message_logs)} message logs but {len(rewards)} rewards")
    if num_samples <= 0 or not message_logs:
        return
    order = sorted(range(len(rewards)), key=lambda i: rewards[i], reverse=True)
    if len(order) > num_samples:
        half = num_samples // 2
        order = order[:half] + order[len(order) - half :] + ([order[len(order) // 2]] if num_samples % 2 else [])
    picked = {"message_log": [message_logs[i] for i in order], "idx": order}
    rows = sample_rows(picked, torch.tensor([float(rewards[i]) for i in order]))
    print_samples(rows, f"Step {step} sample")
