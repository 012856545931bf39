"""Small helpers shared by the algorithms: masked reductions, KL estimators, reward processing, step metrics, and
NeMo-RL's ``set_seed`` / ``get_tokenizer`` / ``surpress_user_warnings``."""

from __future__ import annotations

import functools
import logging
import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from nemo_rl_clone.environments.interfaces import reward_component_keys

# Step metrics live with the rollout machinery; NeMo-RL's module offers them here too.
from nemo_rl_clone.rollout.metrics import combine_batches as combine_batches
from nemo_rl_clone.rollout.metrics import groups_with_signal as groups_with_signal
from nemo_rl_clone.rollout.metrics import reduce_train_results as reduce_train_results

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from nemo_rl_clone.models.policy.config import TokenizerConfig

log = logging.getLogger(__name__)
# NeMo-RL's name: a batch's reward components (reward1, reward2, ...) in number order, which GDPO reads
get_gdpo_reward_component_keys = reward_component_keys
F = TypeVar("F", bound=Callable[..., Any])
KL_TYPES = ("k1", "k2", "k3")


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: int | None = None,
    global_normalization_factor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is non-zero.

    Args:
        values: any shape.
        mask: broadcastable to `values`; 1 (or a weight) where a value counts, 0 where it does not.
            Values at masked-out positions are ignored even when they are NaN or inf, and get a zero
            gradient.
        dim: reduce only this dimension (result has it removed); None reduces everything to a 0-dim
            tensor.
        global_normalization_factor: divide Σ values·mask by this instead of Σ mask, e.g. the number of
            valid tokens across all microbatches and data-parallel ranks, so that one microbatch's result
            is its share of the global mean.

    Returns:
        Σ values·mask / normaliser, and 0 (not NaN) where the normaliser is 0 (empty mask).
    """
    values, mask = torch.broadcast_tensors(values, mask.to(values.dtype))
    kept = torch.where(mask != 0, values * mask, torch.zeros_like(values))
    total = kept.sum() if dim is None else kept.sum(dim=dim)
    if global_normalization_factor is None:
        denominator = mask.sum() if dim is None else mask.sum(dim=dim)
    else:
        denominator = torch.as_tensor(global_normalization_factor, dtype=total.dtype, device=total.device)
    safe_denominator = torch.where(denominator != 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator != 0, total / safe_denominator, torch.zeros_like(total))


def masked_var(
    values: torch.Tensor,
    mask: torch.Tensor,
    mean: torch.Tensor | float | None = None,
    unbiased: bool = True,
) -> torch.Tensor:
    """Variance of ``values`` over the positions where ``mask`` is non-zero (all of them reduced to a 0-dim tensor),
    around ``mean`` (default: their `masked_mean`); ``unbiased`` multiplies by n/(n − 1), n = Σ mask, as NeMo-RL
    does (so one position gives NaN, as there)."""
    if mean is None:
        mean = masked_mean(values, mask)
    variance = masked_mean((values - mean).square(), mask)
    if unbiased:
        count = mask.sum().to(variance.dtype)
        variance = variance * (count / (count - 1))
    return variance


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: str = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
    importance_sampling_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimator of KL(π ‖ π_ref) on tokens sampled from π (Schulman, 2020), NeMo-RL v0.7.0's signature.

    With d = clamp(logprobs_reference − logprobs, ±input_clamp_value):
    k1 = −d (unbiased, can be negative), k2 = d²/2 (biased, ≥ 0), k3 = e^d − d − 1 (unbiased, ≥ 0). The result is
    w·k clamped to ±output_clamp_value, w = ``importance_sampling_weights`` (1 when None); None disables a clamp.

    The weight goes in *before* the output clamp, and is detached where the input clamp binds, so a token where
    either clamp binds contributes no gradient at all. A loss passes w = exp(lp − sg(lp)) (value 1) to keep the
    score-function term k·∇lp of the penalty's gradient; multiplied in after the clamp, that term would survive on
    a clamped token and push an already-suppressed token further below the reference.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"kl_type must be one of {list(KL_TYPES)}, got {kl_type!r}")
    log_ratio = logprobs_reference - logprobs
    weights = importance_sampling_weights
    if input_clamp_value is not None:
        clamped = log_ratio.clamp(min=-input_clamp_value, max=input_clamp_value)
        if weights is not None:
            weights = torch.where(clamped == log_ratio, weights, weights.detach())
        log_ratio = clamped
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = log_ratio.square() / 2
    else:
        kl = log_ratio.exp() - log_ratio - 1
    if weights is not None:
        kl = weights * kl
    if output_clamp_value is not None:
        kl = kl.clamp(min=-output_clamp_value, max=output_clamp_value)
    return kl


# ---------------------------------------------------------------------------------------------------------------
# NeMo-RL's helpers under their names.
# ---------------------------------------------------------------------------------------------------------------


def calculate_baseline_and_std_per_prompt(
    prompts: torch.Tensor,
    rewards: torch.Tensor,
    valid_mask: torch.Tensor,
    leave_one_out_baseline: bool = True,
    std_rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeMo-RL's GRPO baseline: samples whose ``prompts`` rows are identical form a group, in any order.

    Only samples with ``valid_mask`` 1 count. Baseline of sample i: the mean reward of the valid samples of its group
    (without i itself when ``leave_one_out_baseline``: the divisor is then the number of valid samples minus one).
    Std of sample i: the unbiased std of those same rewards, 0 where it is undefined. A group with at most one valid
    sample gets baseline = reward and std 0 (no advantage). The leave-one-out std differs per sample (as in
    `nemo_rl_clone.algorithms.advantage_estimator`, which works on adjacent groups).

    Args:
        prompts: [B, S] prompt token ids (any device).
        rewards: [B] float rewards; the results are on its device and dtype.
        valid_mask: [B] 0/1.
        std_rewards: [B] rewards the std is taken of instead of ``rewards`` (the baseline stays on ``rewards``), as
            NeMo-RL's DAPO filter needs: the std of the raw task score beside the baseline of the shaped reward.
    """
    spread_shape = rewards.shape if std_rewards is None else std_rewards.shape
    if rewards.dim() != 1 or prompts.shape[0] != rewards.shape[0] or valid_mask.shape != rewards.shape:
        raise ValueError(
            f"prompts [B, S], rewards [B] and valid_mask [B] must agree on B; got {tuple(prompts.shape)}, "
            f"{tuple(rewards.shape)} and {tuple(valid_mask.shape)}"
        )
    if spread_shape != rewards.shape:
        raise ValueError(f"std_rewards must be [B] like rewards; got {tuple(spread_shape)}")
    device = rewards.device
    group = torch.unique(prompts, dim=0, return_inverse=True)[1].to(device)
    valid = valid_mask.to(device=device, dtype=rewards.dtype)
    in_group = (group[:, None] == group[None, :]).to(rewards.dtype)
    valid_in_group = in_group @ valid
    # NeMo-RL divides by the group's valid count (minus one with leave-one-out) for every member, valid or not
    count = valid_in_group - int(leave_one_out_baseline)
    others = in_group.fill_diagonal_(0) if leave_one_out_baseline else in_group
    # weights are exact 0/1, so each sum adds exactly the rewards of the samples it is meant to
    mean = others @ (rewards * valid) / count
    spread_of = rewards if std_rewards is None else std_rewards.to(device=device, dtype=rewards.dtype)
    spread_mean = mean if std_rewards is None else others @ (spread_of * valid) / count
    mean_square = others @ (spread_of.square() * valid) / count
    std = ((mean_square - spread_mean.square()) * (count / (count - 1))).sqrt().nan_to_num(0)
    no_signal = valid_in_group <= 1
    return torch.where(no_signal, rewards, mean), torch.where(no_signal, torch.zeros_like(std), std)


def surpress_user_warnings(f: F) -> F:  # NeMo-RL's spelling
    """Decorator: run ``f`` with ``UserWarning`` silenced."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            return f(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def mask_out_neg_inf_logprobs(logprobs: torch.Tensor, mask: torch.Tensor, logprobs_name: str) -> torch.Tensor:
    """``logprobs`` with 0 wherever ``mask`` is 0 or the logprob is infinite (a token outside the training policy's
    top-k/top-p set); logs how many unmasked tokens were infinite."""
    infinite = torch.isinf(logprobs)
    count = int((infinite & mask.bool()).sum())
    if count:
        log.warning(
            "%d/%d valid tokens have infinite %s (top-k/top-p mismatch); masked out",
            count,
            int(mask.sum()),
            logprobs_name,
        )
    return torch.where(mask.bool() & ~infinite, logprobs, torch.zeros_like(logprobs))


def maybe_pad_last_batch(batch: Any, dp_size: int, mbs: int) -> Any:
    """``batch`` (a `BatchedDataDict`) grown in place to a multiple of ``mbs * dp_size`` rows, NeMo-RL's padding of a
    short last validation batch: the added rows repeat the last row's ``input_ids``, ``input_lengths`` and, where
    present, ``token_mask`` and ``reference_policy_logprobs``, and get ``sample_mask`` 0, so they count nowhere.
    Other keys are left as they are. Returns ``batch``."""
    size = batch.size
    missing = math.ceil(size / (mbs * dp_size)) * mbs * dp_size - size
    if missing <= 0:
        return batch
    log.info("padding the last validation batch with %d masked samples", missing)
    for key in ("input_ids", "input_lengths", "token_mask", "reference_policy_logprobs"):
        if key in batch:
            last = batch[key][-1:]
            batch[key] = torch.cat([batch[key], last.expand(missing, *last.shape[1:])])
    sample_mask = batch["sample_mask"]
    batch["sample_mask"] = torch.cat([sample_mask, sample_mask.new_zeros((missing, *sample_mask.shape[1:]))])
    return batch


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, numpy and torch (every device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def get_tokenizer(
    tokenizer_config: TokenizerConfig | Mapping[str, Any], get_processor: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer of ``tokenizer_config`` (a `TokenizerConfig` or NeMo-RL's ``{name, chat_template,
    chat_template_kwargs}`` dict, ``name`` required), with a pad token and the chat template settings applied.

    ``chat_template``: ``"default"`` (or left out) keeps the tokenizer's template, null selects the pass-through
    template, a path ending in ``.jinja`` is read from that file, any other string is the template itself.
    ``get_processor`` (multimodal processors) is not supported.
    """
    from nemo_rl_clone.models.policy.config import TokenizerConfig
    from nemo_rl_clone.utils.config_validation import as_config

    if get_processor:
        raise NotImplementedError(
            "get_tokenizer(get_processor=True) is not supported yet: nemo_rl_clone trains text-only models, which "
            "need no multimodal processor (call get_tokenizer(config))"
        )
    config = as_config(tokenizer_config, TokenizerConfig, key="tokenizer")
    name = config.name
    if not name:
        raise ValueError("tokenizer.name is required: the model name or tokenizer folder to load")
    tokenizer: PreTrainedTokenizerBase = config.load(name)
    return tokenizer
