"""The data layer. NeMo-RL's ``from nemo_rl.data import DataConfig`` (and its other ``data`` config types) reads the
same here, loaded on first use."""

from typing import Any

from nemo_rl_clone.utils.lazy_exports import lazy_getattr
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

_CONFIG_TYPES = (
    "ResponseDatasetConfig",
    "PreferenceDatasetConfig",
    "MMLUEvalDataConfig",
    "MMLUProEvalDataConfig",
    "AIMEEvalDataConfig",
    "GPQAEvalDataConfig",
    "MathEvalDataConfig",
    "LocalMathEvalDataConfig",
    "EvalDataConfigType",
)
_lazy_getattr = lazy_getattr(__name__, {"DataConfig": "config", **dict.fromkeys(_CONFIG_TYPES, "config_types")})
_refusing_getattr = refusing_getattr(
    __name__, {"MMAUEvalDataConfig": "vision and audio inputs (vision-language / audio-language models)"}
)


def __getattr__(name: str) -> Any:
    return _refusing_getattr(name) if name == "MMAUEvalDataConfig" else _lazy_getattr(name)
