"""Generation: the engines' interface (`interfaces`), their config (`config`), the backends (`factory`, `vllm`).
NeMo-RL's ``configure_generation_config`` is importable from here, as from NeMo-RL's package."""

from nemo_rl_clone.models.generation.configure import configure_generation_config

__all__ = ["configure_generation_config"]


def __getattr__(name: str) -> object:
    # NeMo-RL's ``TokenizerType`` alias, resolved on first use so importing the package does not load transformers.
    if name == "TokenizerType":
        from transformers import PreTrainedTokenizerBase

        return PreTrainedTokenizerBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
