"""The policy: `lm_policy.Policy` over its workers, its config (`config`). NeMo-RL v0.7.0's TypedDicts of the
``policy`` section are importable from here, as from NeMo-RL's package (`config_types`); its TypedDicts for features
not built here (NeMo Automodel's options, an enabled EAGLE draft model) stop with one line naming the feature."""

from nemo_rl_clone.models.policy.config_types import (
    DraftConfigDisabled,
    DTensorConfig,
    DTensorConfigDisabled,
    DynamicBatchingConfig,
    DynamicBatchingConfigDisabled,
    Fp8Config,
    LoRAConfig,
    LoRAConfigDisabled,
    MegatronConfig,
    MegatronConfigDisabled,
    MegatronDDPConfig,
    MegatronOptimizerConfig,
    MegatronPeftConfig,
    MegatronPeftConfigDisabled,
    MegatronSchedulerConfig,
    MoEParallelizerOptions,
    PolicyConfig,
    PytorchOptimizerConfig,
    RewardModelConfig,
    RouterReplayConfig,
    RouterReplayConfigDisabled,
    SchedulerMilestones,
    SequencePackingConfig,
    SequencePackingConfigDisabled,
    SinglePytorchMilestonesConfig,
    SinglePytorchSchedulerConfig,
    TokenizerConfig,
)
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

__all__ = [
    "DTensorConfig",
    "DTensorConfigDisabled",
    "DraftConfigDisabled",
    "DynamicBatchingConfig",
    "DynamicBatchingConfigDisabled",
    "Fp8Config",
    "LoRAConfig",
    "LoRAConfigDisabled",
    "MegatronConfig",
    "MegatronConfigDisabled",
    "MegatronDDPConfig",
    "MegatronOptimizerConfig",
    "MegatronPeftConfig",
    "MegatronPeftConfigDisabled",
    "MegatronSchedulerConfig",
    "MoEParallelizerOptions",
    "PolicyConfig",
    "PytorchOptimizerConfig",
    "RewardModelConfig",
    "RouterReplayConfig",
    "RouterReplayConfigDisabled",
    "SchedulerMilestones",
    "SequencePackingConfig",
    "SequencePackingConfigDisabled",
    "SinglePytorchMilestonesConfig",
    "SinglePytorchSchedulerConfig",
    "TokenizerConfig",
]

_AUTOMODEL = "NeMo Automodel (models load through Hugging Face transformers)"
__getattr__ = refusing_getattr(
    __name__,
    {
        "AutomodelBackendConfig": _AUTOMODEL,
        "AutomodelFreezeConfig": _AUTOMODEL,
        "AutomodelKwargs": _AUTOMODEL,
        "DraftConfig": "training a speculative-decoding (EAGLE) draft model",
    },
)
