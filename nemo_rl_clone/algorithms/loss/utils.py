"""NeMo-RL v0.7.0's path (``nemo_rl.algorithms.loss.utils``) of `prepare_loss_input`, which lives in
`nemo_rl_clone.contract.loss_input`, and of `prepare_packed_loss_input`, in `nemo_rl_clone.algorithms.loss.wrapper`
(a facade: see `nemo_rl_clone.facades`)."""

from nemo_rl_clone.algorithms.loss.wrapper import prepare_packed_loss_input
from nemo_rl_clone.contract.loss_input import prepare_loss_input

__all__ = ["prepare_loss_input", "prepare_packed_loss_input"]
