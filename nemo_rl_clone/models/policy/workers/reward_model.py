"""Reward-model mode of the DTensor policy (``policy.reward_model_cfg.enabled``): a Hugging Face sequence-
classification model with one label whose score is read at each row's last valid token.

Why not Hugging Face's own pooling: ``*ForSequenceClassification.forward`` scores the rightmost token that differs
from ``config.pad_token_id``. When pad == eos (the built-in tiny models, many chat models) and a conversation ends
with eos, it scores the token before the eos; a row ending in several pad-id tokens loses all of them. Here the
head's per-token output ``[B, S, 1]`` is captured from inside the normal forward (so FSDP's root hooks still gather
the head and embeddings) and indexed at ``input_lengths - 1`` of the right-padded batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig, PreTrainedModel

from nemo_rl_clone.models.policy.workers.packed_sequences import PackedRows, PaddedRows

# A causal-LM checkpoint has no score head; from_pretrained initialises it from torch's global RNG. Seeding that
# draw (inside a forked RNG, so nothing else is affected) gives every rank, every run and every resume-from-HF the
# same head; FSDP2 shards each rank's own copy of a parameter and would otherwise mix heads from different ranks.
SCORE_HEAD_INIT_SEED = 0


def reward_model_error(method: str) -> RuntimeError:
    """The error every language-model-only method raises on a reward-model policy."""
    return RuntimeError(
        f"{method} is not available for a reward model (policy.reward_model_cfg.enabled=true): it has a scalar "
        "score head, no language-model head or generation weights; use Policy.score(data) for its scores"
    )


def load_reward_model(
    model_path: str,
    pad_token_id: int | None,
    attn_implementation: str = "sdpa",
    hf_config: PretrainedConfig | None = None,
) -> PreTrainedModel:
    """``AutoModelForSequenceClassification`` with 1 label, fp32, from a seq-cls or causal-LM checkpoint
    (``hf_config``: the model's config to build it with, e.g. with ``policy.hf_config_overrides`` applied).

    ``pad_token_id`` fills a missing ``config.pad_token_id`` (Hugging Face's forward refuses batches without one;
    the exported config then works for plain transformers users too).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SCORE_HEAD_INIT_SEED)
        config = hf_config if hf_config is not None else AutoConfig.from_pretrained(model_path)
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_pretrained(
            model_path, config=config, dtype=torch.float32, attn_implementation=attn_implementation
        )
    head = getattr(model, "score", None)
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"policy.reward_model_cfg: {type(model).__name__} ({model_path}) has no linear 'score' head; reward "
            "models need a decoder model whose sequence-classification class names its head 'score' (Llama, Qwen2, ...)"
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_token_id
    return model


def scores_at_last_valid_token(token_scores: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` rows of ``token_scores`` ``[B, S, L]`` at position ``input_lengths - 1`` (right padding)."""
    rows = torch.arange(token_scores.shape[0], device=token_scores.device)
    return token_scores[rows, input_lengths.to(token_scores.device) - 1]


class LastTokenScorer:
    """Runs the (possibly FSDP-wrapped) model and returns its scores ``[B, 1]`` at each row's last valid token.

    A forward hook on the ``score`` head keeps its per-token output ``[B, S, 1]`` (with its autograd graph, so the
    scores can be trained); the pooled output Hugging Face computes is ignored.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._token_scores: torch.Tensor | None = None
        model.get_submodule("score").register_forward_hook(self._keep_output)

    def _keep_output(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self._token_scores = output

    def _head_outputs(self, input_ids: torch.Tensor, rows: PaddedRows | PackedRows | None) -> torch.Tensor:
        """The head's ``[B, S, 1]`` outputs of right-padded ``input_ids`` ``[B, S]``, run as ``rows`` lays them out."""
        rows = rows or PaddedRows(input_ids)
        self.model(input_ids=rows.pack(input_ids), use_cache=False, **rows.model_kwargs())
        token_scores, self._token_scores = self._token_scores, None
        assert token_scores is not None, "the score head did not run"
        return rows.unpack(token_scores)

    def __call__(
        self, input_ids: torch.Tensor, input_lengths: torch.Tensor, rows: PaddedRows | PackedRows | None = None
    ) -> torch.Tensor:
        """Scores ``[B, 1]`` of right-padded ``input_ids`` ``[B, S]``, run as ``rows`` lays them out (default: as is)."""
        return self.from_head(self._head_outputs(input_ids, rows), input_lengths)

    @staticmethod
    def from_head(token_scores: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
        """The scores of the head's per-token outputs ``[B, S, 1]`` (also what a backend with its own head uses)."""
        return scores_at_last_valid_token(token_scores, input_lengths)

    @staticmethod
    def reported(scores: torch.Tensor, width: int) -> torch.Tensor:
        """What ``score`` hands back for a microbatch's ``scores``: ``[B]``."""
        return scores[:, 0]


class TokenValueScorer(LastTokenScorer):
    """``reward_model_type: regression`` (PPO's critic): the head at every position, ``[B, S]``, shifted one to the
    right — ``values[:, t]`` is read at position t − 1, i.e. it is the value of the state in which token t is
    generated (0 at t = 0). GAE, the actor's per-token advantages and the value loss then all index tokens alike."""

    @staticmethod
    def from_head(token_scores: torch.Tensor, input_lengths: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(token_scores[:, :-1, 0], (1, 0))

    @staticmethod
    def reported(scores: torch.Tensor, width: int) -> torch.Tensor:
        """``[B, width]``: a microbatch cut to its longest row (dynamic batching) is padded back with zeros."""
        return torch.nn.functional.pad(scores, (0, width - scores.shape[1]))


def scorer_class(reward_model_type: str) -> type[LastTokenScorer]:
    """``regression``: a critic's per-token values; ``bradley_terry``: a reward model's last-token score."""
    return TokenValueScorer if reward_model_type == "regression" else LastTokenScorer


def make_scorer(model: nn.Module, reward_model_type: str) -> LastTokenScorer:
    return scorer_class(reward_model_type)(model)


def check_input_lengths(data: Mapping[str, Any], method: str) -> None:
    """Every row must have ``1 <= input_lengths <= S``: index ``input_lengths - 1`` would otherwise wrap silently."""
    lengths, width = data["input_lengths"], data["input_ids"].shape[1]
    bad = ((lengths < 1) | (lengths > width)).nonzero().flatten()
    if len(bad):
        row = int(bad[0])
        raise ValueError(
            f"{method}: input_lengths[{row}] = {int(lengths[row])} is outside [1, {width}] (the width of input_ids); "
            "a reward model scores the token at input_lengths - 1 of each right-padded row"
        )
