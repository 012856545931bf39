"""NeMo-RL v0.7.0's path (``nemo_rl.algorithms.loss.utils``) of `prepare_loss_input`, which lives in
`nemo_rl_clone.contract.loss_input` (a facade: see `nemo_rl_clone.facades`)."""

from nemo_rl_clone.contract.loss_input import prepare_loss_input

__all__ = ["prepare_loss_input"]
