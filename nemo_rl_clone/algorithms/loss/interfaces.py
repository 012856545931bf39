"""NeMo-RL v0.7.0's path (``nemo_rl.algorithms.loss.interfaces``) of the loss protocol, which lives in
`nemo_rl_clone.contract.loss` (a facade: see `nemo_rl_clone.facades`)."""

from nemo_rl_clone.contract.loss import LossFunction, LossInputType, LossType, TokenLogprobs

__all__ = ["LossFunction", "LossInputType", "LossType", "TokenLogprobs"]
