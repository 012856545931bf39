"""What an algorithm is to the rest of the library: the interface the registry (`algorithms.registry`), the entry
points, pre-flight and the dry run ask, so that none of them tells algorithms apart by their config's sections.

An algorithm also brings its step for the shared training loop (`run.loop.StepAlgorithm`), built by its ``train``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class Algorithm(ABC):
    """One trainable algorithm (GRPO, SFT, DPO, RM, distillation, ...), registered by ``name``.

    ``config_class`` is the whole-run config schema (validated once, before anything starts); ``setup`` builds a run
    from a validated config (resuming from its checkpoint directory), ``train`` runs it to the end. The other hooks
    describe the run for pre-flight and the dry run; their defaults fit a policy trained on whole sequences.
    """

    name: ClassVar[str]
    config_class: ClassVar[type]

    @abstractmethod
    def setup(self, config: Any) -> Any:
        """The run's components (workers, data, logger, checkpoints, state); they have ``shutdown()``."""

    @abstractmethod
    def train(self, run: Any) -> None:
        """Train ``run`` until its schedule ends (through `run.loop.train_loop`)."""

    @abstractmethod
    def datasets(self, config: Any, tokenizer: Any) -> tuple[Any, Any, int | None]:
        """(train rows, validation rows or None, length limit) as the run's setup builds them."""

    def needs_reference_model(self, config: Any) -> bool:
        """Whether the policy workers keep a frozen copy of the initial weights (their memory plan counts it)."""
        return False

    def loss_token_share(self, config: Any) -> float:
        """The share of a training microbatch's tokens the loss reads (RL losses read the responses only)."""
        return 1.0

    def multi_turn(self, config: Any) -> bool:
        """Whether rollouts append turns to a conversation (the chat template must then be append-only)."""
        return False

    def frozen_models(self, config: Any) -> dict[str, Any]:
        """Inference-only models on the training workers, by config section (distillation's ``teacher``)."""
        return {}

    def trained_models(self, config: Any) -> dict[str, Any]:
        """Further trained models on the training workers besides ``policy``, by config section (PPO's critic,
        ``value``): pre-flight checks their sources and the dry run plans their optimizer state too."""
        return {}
