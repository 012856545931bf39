"""NeMo-RL v0.7.0's path of a feature not built here (`facades.REFUSED`): importing it stops with one line."""

from nemo_rl_clone.utils.unsupported_modules import refuse_import

refuse_import(__name__, "GPU memory logging of Megatron-Core's inference engine")
