"""Collapse monitors of a GRPO run: `monitor/*` metrics every step, and a console warning when one fires.

Each monitor turns one step's metrics (and the step's validation results, when a validation ran) into a statistic,
compares it with a threshold relative to the run's own history, and reports a 0/1 ``monitor/<name>_alert``:

- ``entropy``: ``train/approx_entropy`` below ``min_ratio`` × its early-run value (the mean of the first
  ``monitors.baseline_steps`` steps);
- ``kl``, ``clip``, ``mismatch`` (spikes): the statistic above ``factor`` × its median over the previous
  ``monitors.window`` steps and above ``floor``, or above ``bound`` at any time;
- ``length``: the mean response length outside [``min_ratio``, ``max_ratio``] × its early-run value, or the share
  of responses cut at the token limit above ``max_truncation_rate``;
- ``zero_variance``: the share of prompt groups whose rewards are all equal (no advantage, no gradient), averaged
  over the last ``num_steps`` steps, above ``max_fraction``;
- ``reward_vs_validation``: over the last ``num_validations`` validations, the mean training reward rose while the
  validation ``metric`` fell by more than ``min_drop``.

A monitor warns when it enters the alert state, and again only after it cleared. The histories are checkpointed with
the run (``RunState.monitors``). What each monitor means and what to do about it: docs/monitors.md.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nemo_rl_clone.rollout.metrics import groups_with_signal
from nemo_rl_clone.rollout.monitor_config import (
    EntropyMonitorConfig,
    LengthMonitorConfig,
    MonitorsConfig,
    RewardValidationMonitorConfig,
    SpikeMonitorConfig,
    ZeroVarianceMonitorConfig,
)
from nemo_rl_clone.utils.progress import console

# Keeps value/median finite when the median is 0 (e.g. the KL term with a zero KL coefficient).
_TINY = 1e-12


@dataclass
class Observation:
    """One monitor's verdict on one step: the statistics to log, whether it is alerting, and why (the warning)."""

    metrics: dict[str, float]
    alert: bool = False
    message: str = ""


class _Baseline:
    """The mean of a statistic's first ``steps`` values: the run's early value it is compared with."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.values: list[float] = []

    def ratio(self, value: float) -> tuple[float, float, bool]:
        """(value / baseline, baseline, whether the baseline was complete before ``value``): while it is not, the
        value joins it and no relative threshold applies yet."""
        ready = len(self.values) == self.steps
        if not ready:
            self.values.append(value)
        baseline = statistics.fmean(self.values)
        return value / max(baseline, _TINY), baseline, ready


class _BaselineState:
    """Checkpoint state of a monitor whose only history is its early-run baseline."""

    baseline: _Baseline

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": list(self.baseline.values)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.baseline.values = [float(v) for v in state["baseline"]][: self.baseline.steps]


class EntropyMonitor(_BaselineState):
    name = "entropy"

    def __init__(self, cfg: EntropyMonitorConfig, baseline_steps: int) -> None:
        self.cfg, self.baseline = cfg, _Baseline(baseline_steps)

    def observe(self, metrics: Mapping[str, float], validation: Mapping[str, float]) -> Observation | None:
        if "approx_entropy" not in metrics:
            return None
        entropy = metrics["approx_entropy"]
        ratio, baseline, ready = self.baseline.ratio(entropy)
        result = Observation({"entropy_ratio": ratio})
        if ready and ratio < self.cfg.min_ratio:
            result.alert = True
            result.message = (
                f"entropy collapse: train/approx_entropy {entropy:.4g} is {ratio:.2f}x its early-run value "
                f"{baseline:.4g} (below monitors.entropy.min_ratio {self.cfg.min_ratio}). The policy is becoming "
                "deterministic: raise the sampling temperature, lower the learning rate, or loosen ratio_clip_max "
                "(clip-higher)."
            )
        return result


class SpikeMonitor:
    """A statistic that should stay near its recent level (``statistic`` returns None when the step lacks it)."""

    def __init__(
        self,
        name: str,
        cfg: SpikeMonitorConfig,
        window: int,
        min_history: int,
        statistic: Callable[[Mapping[str, float]], float | None],
        describe: str,
        advice: str,
        log_value: bool,
    ) -> None:
        self.name, self.cfg, self.statistic = name, cfg, statistic
        self.history: deque[float] = deque(maxlen=window)
        self.min_history, self.describe, self.advice, self.log_value = min_history, describe, advice, log_value

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history.extend(float(v) for v in state["history"])

    def observe(self, metrics: Mapping[str, float], validation: Mapping[str, float]) -> Observation | None:
        value = self.statistic(metrics)
        if value is None:
            return None
        cfg, seen = self.cfg, len(self.history)
        median = statistics.median(self.history) if seen else value
        ratio = value / max(median, _TINY) if seen else 1.0
        spike = seen >= self.min_history and value > cfg.floor and value > cfg.factor * median
        over_bound = cfg.bound is not None and value > cfg.bound
        self.history.append(value)
        result = Observation({f"{self.name}_ratio": ratio, **({self.name: value} if self.log_value else {})})
        if spike or over_bound:
            key = f"monitors.{self.name}"
            why = (
                f"above {key}.bound {cfg.bound}"
                if over_bound
                else f"{ratio:.1f}x its median {median:.4g} over the last {seen} steps "
                f"(above {key}.factor {cfg.factor} and {key}.floor {cfg.floor})"
            )
            result.alert, result.message = True, f"{self.describe} {value:.4g} is {why}. {self.advice}"
        return result


class LengthMonitor(_BaselineState):
    name = "length"

    def __init__(self, cfg: LengthMonitorConfig, baseline_steps: int) -> None:
        self.cfg, self.baseline = cfg, _Baseline(baseline_steps)

    def observe(self, metrics: Mapping[str, float], validation: Mapping[str, float]) -> Observation | None:
        if "rollout/mean_generation_length" not in metrics:
            return None
        cfg, length = self.cfg, metrics["rollout/mean_generation_length"]
        truncation = metrics.get("rollout/truncation_rate", 0.0)
        ratio, baseline, ready = self.baseline.ratio(length)
        result = Observation({"length_ratio": ratio})
        if truncation > cfg.max_truncation_rate:
            result.alert = True
            result.message = (
                f"response length: {truncation:.0%} of the responses hit the token limit (above "
                f"monitors.length.max_truncation_rate {cfg.max_truncation_rate}); their rewards judge unfinished "
                "answers: raise policy.generation.max_new_tokens, or turn on grpo.overlong_filtering or "
                "grpo.reward_shaping."
            )
        elif ready and not cfg.min_ratio <= ratio <= cfg.max_ratio:
            bound = "min_ratio" if ratio < cfg.min_ratio else "max_ratio"
            result.alert = True
            result.message = (
                f"response length drift: mean {length:.1f} tokens is {ratio:.2f}x its early-run value {baseline:.1f} "
                f"(outside monitors.length.{bound} {getattr(cfg, bound)}). Look at the samples for a reward "
                "shortcut (empty or padded answers); consider a length-aware reward or grpo.reward_shaping."
            )
        return result


class ZeroVarianceMonitor:
    name = "zero_variance"

    def __init__(self, cfg: ZeroVarianceMonitorConfig) -> None:
        self.cfg = cfg
        self.history: deque[float] = deque(maxlen=cfg.num_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history.extend(float(v) for v in state.get("history", []))

    def observe(self, metrics: Mapping[str, float], validation: Mapping[str, float]) -> Observation | None:
        if "zero_variance_group_fraction" not in metrics:
            return None
        fraction = metrics["zero_variance_group_fraction"]
        self.history.append(fraction)
        mean = statistics.fmean(self.history)
        result = Observation({"zero_variance_group_fraction": fraction, "zero_variance_group_fraction_mean": mean})
        if len(self.history) == self.cfg.num_steps and mean > self.cfg.max_fraction:
            result.alert = True
            result.message = (
                f"zero-variance groups: over the last {self.cfg.num_steps} steps {mean:.0%} of the prompt groups "
                f"had all-equal rewards (above monitors.zero_variance.max_fraction {self.cfg.max_fraction}); GRPO "
                "learns nothing from them. Use data of a difficulty the model sometimes solves, raise "
                "grpo.num_generations_per_prompt, or turn on grpo.use_dynamic_sampling."
            )
        return result


class RewardValidationMonitor:
    name = "reward_vs_validation"

    def __init__(self, cfg: RewardValidationMonitorConfig) -> None:
        self.cfg = cfg
        self.rewards_since_validation: list[float] = []
        # (mean training reward since the previous validation, validation metric) per validation
        self.records: deque[tuple[float, float]] = deque(maxlen=cfg.num_validations)
        self.trends = (0.0, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rewards_since_validation": list(self.rewards_since_validation),
            "records": [list(record) for record in self.records],
            "trends": list(self.trends),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rewards_since_validation = [float(v) for v in state["rewards_since_validation"]]
        self.records.extend((float(reward), float(value)) for reward, value in state["records"])
        reward_trend, validation_trend = state["trends"]
        self.trends = (float(reward_trend), float(validation_trend))

    def observe(self, metrics: Mapping[str, float], validation: Mapping[str, float]) -> Observation | None:
        cfg = self.cfg
        if "reward" in metrics:
            self.rewards_since_validation.append(metrics["reward"])
        if cfg.metric in validation and self.rewards_since_validation:
            self.records.append((statistics.fmean(self.rewards_since_validation), validation[cfg.metric]))
            self.rewards_since_validation = []
            first, last = self.records[0], self.records[-1]
            self.trends = (last[0] - first[0], last[1] - first[1])
        reward_trend, validation_trend = self.trends
        result = Observation({"reward_trend": reward_trend, "validation_trend": validation_trend})
        if len(self.records) == cfg.num_validations and reward_trend > 0 and validation_trend < -cfg.min_drop:
            result.alert = True
            result.message = (
                f"reward up, validation down: over the last {cfg.num_validations} validations the training reward "
                f"rose by {reward_trend:.4g} while validation/{cfg.metric} fell by {-validation_trend:.4g} (more than "
                "monitors.reward_vs_validation.min_drop "
                f"{cfg.min_drop}). The policy may be exploiting the reward or overfitting the training prompts: read "
                "the samples, check the verifier, and compare with an earlier checkpoint."
            )
        return result


Monitor = EntropyMonitor | SpikeMonitor | LengthMonitor | ZeroVarianceMonitor | RewardValidationMonitor


def _mismatch_excess(metrics: Mapping[str, float]) -> float | None:
    value = metrics.get("token_mult_prob_error")
    return None if value is None else value - 1.0


def _clip_gap(metrics: Mapping[str, float]) -> float | None:
    if "probs_ratio" not in metrics or "probs_ratio_clamped" not in metrics:
        return None
    return abs(metrics["probs_ratio"] - metrics["probs_ratio_clamped"])


def build_monitors(cfg: MonitorsConfig) -> list[Monitor]:
    """The enabled monitors of ``cfg`` (none when ``cfg.enabled`` is false)."""
    if not cfg.enabled:
        return []
    k = cfg.baseline_steps
    candidates: list[tuple[bool, Callable[[], Monitor]]] = [
        (cfg.entropy.enabled, lambda: EntropyMonitor(cfg.entropy, k)),
        (
            cfg.kl.enabled,
            lambda: SpikeMonitor(
                "kl",
                cfg.kl,
                cfg.window,
                k,
                lambda m: m.get("kl_penalty"),
                "KL spike: train/kl_penalty",
                "The policy is leaving the reference fast: lower the learning rate, raise "
                "loss_fn.reference_policy_kl_penalty, or resume from an earlier checkpoint.",
                log_value=False,
            ),
        ),
        (
            cfg.clip.enabled,
            lambda: SpikeMonitor(
                "clip",
                cfg.clip,
                cfg.window,
                k,
                _clip_gap,
                "clip jump: |train/probs_ratio - train/probs_ratio_clamped|",
                "Updates move the policy far within a step: lower the learning rate, or use fewer optimizer steps "
                "per rollout batch (a larger policy.train_global_batch_size).",
                log_value=True,
            ),
        ),
        (
            cfg.mismatch.enabled,
            lambda: SpikeMonitor(
                "mismatch",
                cfg.mismatch,
                cfg.window,
                k,
                _mismatch_excess,
                "trainer/generator mismatch: train/token_mult_prob_error - 1",
                "The engines' logprobs disagree with the trainer's: check that refit ran, that both use the same "
                "precision and sampling settings, and consider loss_fn.use_importance_sampling_correction.",
                log_value=True,
            ),
        ),
        (cfg.length.enabled, lambda: LengthMonitor(cfg.length, k)),
        (cfg.zero_variance.enabled, lambda: ZeroVarianceMonitor(cfg.zero_variance)),
        (cfg.reward_vs_validation.enabled, lambda: RewardValidationMonitor(cfg.reward_vs_validation)),
    ]
    return [make() for enabled, make in candidates if enabled]


def zero_variance_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Share of the prompt groups (consecutive ``group_size`` rewards) whose rewards are all equal."""
    return 1.0 - groups_with_signal(rewards, group_size).float().mean().item()


class CollapseMonitors:
    """The run's monitors with their history. ``observe`` is the pure step (metrics in, metrics and warnings out);
    ``update`` is what the GRPO loop calls: it adds the zero-variance share and prints the warnings. ``state``
    (a `state_dict`, kept in the run's checkpoints) resumes the histories of a previous run."""

    def __init__(self, cfg: MonitorsConfig, group_size: int, state: Mapping[str, Any] | None = None) -> None:
        self.monitors = build_monitors(cfg)
        self.group_size = group_size
        self.alerting = {monitor.name: False for monitor in self.monitors}
        state = state or {}
        saved, alerting = state.get("monitors", {}), state.get("alerting", {})
        for monitor in self.monitors:  # a monitor the saved run did not have starts afresh
            if monitor.name in saved:
                monitor.load_state_dict(saved[monitor.name])
                self.alerting[monitor.name] = bool(alerting.get(monitor.name, False))

    def state_dict(self) -> dict[str, Any]:
        """Plain lists and numbers (JSON): the monitors' histories and which of them are alerting."""
        return {
            "alerting": dict(self.alerting),
            "monitors": {monitor.name: monitor.state_dict() for monitor in self.monitors},
        }

    def observe(
        self, step: int, metrics: Mapping[str, float], validation: Mapping[str, float]
    ) -> tuple[dict[str, float], list[str]]:
        """``metrics``: the step's ``train/*`` metrics without the prefix (plus ``zero_variance_group_fraction``);
        ``validation``: the step's validation metrics (empty when none ran). Returns the ``monitor/*`` metrics
        (without the prefix) and the warnings of the monitors that entered their alert state at this step."""
        logged: dict[str, float] = {}
        warnings = []
        for monitor in self.monitors:
            result = monitor.observe(metrics, validation)
            alert = result is not None and result.alert
            if result is not None:
                logged.update(result.metrics)
            logged[f"{monitor.name}_alert"] = float(alert)
            if alert and not self.alerting[monitor.name]:
                assert result is not None
                warnings.append(f"step {step}: monitor {result.message}")
            self.alerting[monitor.name] = alert
        return logged, warnings

    def update(
        self, step: int, metrics: Mapping[str, float], rewards: torch.Tensor, validation: Mapping[str, float]
    ) -> dict[str, float]:
        """`observe` one GRPO step, with the share of zero-variance groups among the trained ``rewards``; print each
        warning as one yellow line; return the ``monitor/*`` metrics to log (none when all monitors are off)."""
        if not self.monitors:
            return {}
        fraction = zero_variance_group_fraction(rewards, self.group_size)
        logged, warnings = self.observe(step, {**metrics, "zero_variance_group_fraction": fraction}, validation)
        for warning in warnings:
            console.print(warning, style="yellow", markup=False, highlight=False, soft_wrap=True)
        return logged
