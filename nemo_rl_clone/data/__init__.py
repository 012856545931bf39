"""The data layer. NeMo-RL's ``from nemo_rl.data import DataConfig`` reads the same here (loaded on first use)."""

from nemo_rl_clone.utils.lazy_exports import lazy_getattr

__getattr__ = lazy_getattr(__name__, {"DataConfig": "config"})
