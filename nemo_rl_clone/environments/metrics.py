"""Metrics over a batch of scored responses (NeMo-RL v0.7.0's ``nemo_rl.environments.metrics``)."""

from __future__ import annotations

import torch


def calculate_pass_rate_per_prompt(prompts: torch.Tensor, is_correct: torch.Tensor) -> float:
    """The fraction of distinct prompts with at least one correct response (``is_correct > 0``).

    ``prompts``: (batch, seq) token ids, one row per response (equal rows are the same prompt); ``is_correct``:
    (batch,) rewards or booleans, on any device.
    """
    unique_prompts, group_of_row = torch.unique(prompts, dim=0, return_inverse=True)
    passed = torch.zeros(len(unique_prompts), dtype=torch.bool, device=prompts.device)
    passed.index_put_((group_of_row,), is_correct.to(prompts.device) > 0, accumulate=True)
    return passed.sum().item() / len(unique_prompts)
