"""The collapse monitors' config (``monitors``, ours, not NeMo-RL's; docs/monitors.md): one section per monitor of
`nemo_rl_clone.rollout.monitors`."""

from __future__ import annotations

from dataclasses import dataclass, field

from nemo_rl_clone.utils.config_validation import SectionReads


@dataclass
class EntropyMonitorConfig(SectionReads):
    """Entropy collapse: ``train/approx_entropy`` below ``min_ratio`` × its early-run value."""

    enabled: bool = True  # false: this monitor neither logs nor warns
    min_ratio: float = 0.3

    def check(self) -> list[tuple[str, str]]:
        if not 0 < self.min_ratio < 1:
            return [("min_ratio", f"must be in (0, 1): a fraction of the early-run entropy, got {self.min_ratio}")]
        return []


@dataclass
class SpikeMonitorConfig(SectionReads):
    """A spike: the statistic above ``factor`` × its recent median and above ``floor`` (below the floor nothing is a
    spike, however small the median), or above ``bound`` at any time (null: no absolute bound)."""

    enabled: bool = True  # false: this monitor neither logs nor warns
    factor: float = 5.0
    floor: float = 0.05
    bound: float | None = None

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.factor <= 1:
            problems.append(("factor", f"must be > 1: a multiple of the recent median, got {self.factor}"))
        if self.floor < 0:
            problems.append(("floor", f"must be >= 0, got {self.floor}"))
        if self.bound is not None and self.bound <= self.floor:
            problems.append(("bound", f"must be > floor ({self.bound} <= {self.floor}), or null for no bound"))
        return problems


@dataclass
class KLMonitorConfig(SpikeMonitorConfig):
    """KL spike: ``train/kl_penalty`` (the KL to the reference, without its coefficient)."""


@dataclass
class ClipMonitorConfig(SpikeMonitorConfig):
    """Clip jump: |``train/probs_ratio`` − ``train/probs_ratio_clamped``|, the mean ratio mass the clip removed."""

    floor: float = 0.005
    bound: float | None = 0.05


@dataclass
class MismatchMonitorConfig(SpikeMonitorConfig):
    """Trainer/generator mismatch: ``train/token_mult_prob_error`` − 1 (0 when they agree exactly)."""

    floor: float = 0.01
    bound: float | None = 0.05


@dataclass
class LengthMonitorConfig(SectionReads):
    """Length drift: the mean response length outside [min_ratio, max_ratio] × its early-run value, or more than
    ``max_truncation_rate`` of the responses cut at the token limit."""

    enabled: bool = True  # false: this monitor neither logs nor warns
    min_ratio: float = 0.3  # warn when the mean response length falls below this × its early-run value
    max_ratio: float = 3.0  # or rises above this × it
    max_truncation_rate: float = 0.5

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if not 0 < self.min_ratio < 1:
            problems.append(("min_ratio", f"must be in (0, 1), got {self.min_ratio}"))
        if self.max_ratio <= 1:
            problems.append(("max_ratio", f"must be > 1, got {self.max_ratio}"))
        if not 0 < self.max_truncation_rate < 1:
            problems.append(("max_truncation_rate", f"must be in (0, 1), got {self.max_truncation_rate}"))
        return problems


@dataclass
class ZeroVarianceMonitorConfig(SectionReads):
    """Over the last ``num_steps`` steps, more than ``max_fraction`` of the prompt groups had all-equal rewards.

    Judged on a mean over steps because one step holds few groups (the main job: 8), so a single step's share
    jumps by 1/8 at a time and would flip the alert on and off."""

    enabled: bool = True  # false: this monitor neither logs nor warns
    max_fraction: float = 0.8
    num_steps: int = 5

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if not 0 < self.max_fraction < 1:
            problems.append(
                ("max_fraction", f"must be in (0, 1) (set enabled: false to turn it off), got {self.max_fraction}")
            )
        if self.num_steps < 1:
            problems.append(("num_steps", f"must be >= 1, got {self.num_steps}"))
        return problems


@dataclass
class RewardValidationMonitorConfig(SectionReads):
    """Over the last ``num_validations`` validations the training reward rose while ``validation/<metric>`` fell
    by more than ``min_drop``."""

    enabled: bool = True  # false: this monitor neither logs nor warns
    num_validations: int = 3
    min_drop: float = 0.02
    metric: str = "accuracy"  # the validation/<metric> compared with the training reward

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.num_validations < 2:
            problems.append(("num_validations", f"must be >= 2 (a trend needs two points), got {self.num_validations}"))
        if self.min_drop < 0:
            problems.append(("min_drop", f"must be >= 0, got {self.min_drop}"))
        return problems


@dataclass
class MonitorsConfig(SectionReads):
    """The collapse monitors of GRPO (docs/monitors.md). ``baseline_steps``: the early-run value of a statistic is
    its mean over the first that many steps; ``window``: a spike is measured against the median of that many
    previous steps. Relative thresholds act once ``baseline_steps`` steps are seen."""

    enabled: bool = True  # false: no monitor runs, and no monitor/* metrics are logged
    baseline_steps: int = 3
    window: int = 10
    entropy: EntropyMonitorConfig = field(default_factory=EntropyMonitorConfig)
    kl: KLMonitorConfig = field(default_factory=KLMonitorConfig)
    clip: ClipMonitorConfig = field(default_factory=ClipMonitorConfig)
    mismatch: MismatchMonitorConfig = field(default_factory=MismatchMonitorConfig)
    length: LengthMonitorConfig = field(default_factory=LengthMonitorConfig)
    zero_variance: ZeroVarianceMonitorConfig = field(default_factory=ZeroVarianceMonitorConfig)
    reward_vs_validation: RewardValidationMonitorConfig = field(default_factory=RewardValidationMonitorConfig)

    def check(self) -> list[tuple[str, str]]:
        problems = []
        if self.baseline_steps < 1:
            problems.append(("baseline_steps", f"must be >= 1, got {self.baseline_steps}"))
        if self.window < 1:
            problems.append(("window", f"must be >= 1, got {self.window}"))
        return problems
