"""Sample rows: one JSON-ready dict per rollout sample (prompt, response, reward, ...), as the logger dumps them
(`Logger.log_samples_jsonl`), the rollout viewer reads them (docs/rollout_viewer.md) and the console prints them.

Kept out of the RL step code so that the logger (`print_message_log_samples`) can build rows without importing
algorithm modules, whose configs import the logger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nemo_rl_clone.utils.progress import console


def sample_rows(
    batch: Mapping[str, Any],
    rewards: torch.Tensor,
    advantages: torch.Tensor | None = None,
    tokenizer: Any = None,
    train_data: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One JSON row per sample: prompt text (the messages before the first answer, template markup included),
    response text (everything from the first answer on: in a multi-turn episode the environment's replies too),
    reward, advantage (when given), the prompt's dataset index and ``truncated`` (the rollout's per-sample flag
    behind ``rollout/truncation_rate``, when the batch has it).

    With ``tokenizer``, each row also describes the response token by token (read by the rollout viewer,
    docs/rollout_viewer.md), with floats rounded to 4 decimals: ``tokens`` (each token's text, joining to the
    response), ``generation_logprobs`` (the engine's), ``segments`` (``[role, token count]`` per message: assistant
    turns and environment replies) and, with ``train_data`` (the step's training batch, rows in the same order),
    ``loss_mask`` (``token_mask`` × ``sample_mask``) and ``trainer_logprobs`` (``prev_logprobs``: only when the step
    computed them).
    """
    rows = []
    for i, log in enumerate(batch["message_log"]):
        first = next((k for k, m in enumerate(log) if m["role"] == "assistant"), len(log))
        prompt = "".join(m["content"] for m in log[:first])
        response = "".join(m["content"] for m in log[first:])
        row: dict[str, Any] = {"prompt": prompt, "response": response, "reward": float(rewards[i])}
        if advantages is not None:
            row["advantage"] = float(advantages[i])
        row["idx"] = batch["idx"][i]
        if "truncated" in batch:
            row["truncated"] = bool(batch["truncated"][i])
        if tokenizer is not None:
            row.update(_response_tokens(log, first, tokenizer, train_data, i))
        rows.append(row)
    return rows


def one_row_slices(columns: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Sample ``i`` of a batch of equal-length columns (tensors ``[B, ...]`` or lists; a `BatchedDataDict` is one) as
    ``{key: column[i : i + 1], ..., "idx": i}``: NeMo-RL's rows of ``log_batched_dict_as_jsonl``."""
    lengths = set()
    for key, value in columns.items():
        if not isinstance(value, list) and not (isinstance(value, torch.Tensor) and value.ndim >= 1):
            raise TypeError(f"column {key!r} must be a tensor [B, ...] or a list, got {type(value).__name__}")
        lengths.add(len(value))
    if len(lengths) > 1:
        raise ValueError(f"columns of different lengths: {sorted(lengths)}")
    return [
        {**{key: value[i : i + 1] for key, value in columns.items()}, "idx": i} for i in range(max(lengths, default=0))
    ]


def token_texts(token_ids: Sequence[int], tokenizer: Any) -> list[str]:
    """Each token's text, decoded one id after another so that the texts join to ``tokenizer.decode(token_ids)``.

    A token is decoded after a few tokens of context (decoding it alone would drop a SentencePiece word's leading
    space); a token ending inside a multi-byte character gets ``""`` and the character goes to the token that
    completes it.
    """
    ids = [int(t) for t in token_ids]
    texts: list[str] = []
    base, before = 0, ""  # `before` is the decoding of ids[base:k]
    for k in range(len(ids)):
        text = tokenizer.decode(ids[base : k + 1], skip_special_tokens=False)
        if text.endswith("\ufffd") and k + 1 < len(ids):  # an incomplete character: its next byte comes next
            texts.append("")
            continue
        texts.append(text[len(before) :] if text.startswith(before) else tokenizer.decode(ids[k : k + 1]))
        before = text
        if k + 1 - base > 2 * _DECODE_CONTEXT:  # keep every decode short: the cost stays linear in the length
            base = k + 1 - _DECODE_CONTEXT
            before = tokenizer.decode(ids[base : k + 1], skip_special_tokens=False)
    return texts


# Tokens decoded before the one whose text is wanted (see `token_texts`).
_DECODE_CONTEXT = 4


def _response_tokens(
    log: list[dict[str, Any]], first: int, tokenizer: Any, train_data: Mapping[str, Any] | None, row: int
) -> dict[str, Any]:
    """The per-token fields of `sample_rows` for the messages ``log[first:]``."""
    messages = log[first:]
    tokens = [text for m in messages for text in token_texts(m["token_ids"], tokenizer)]
    fields: dict[str, Any] = {
        "tokens": tokens,
        "segments": [[m["role"], len(m["token_ids"])] for m in messages],
    }
    if messages and all("generation_logprobs" in m for m in messages):
        fields["generation_logprobs"] = _rounded(torch.cat([m["generation_logprobs"] for m in messages]))
    if train_data is not None:
        start = sum(len(m["token_ids"]) for m in log[:first])
        span = slice(start, start + len(tokens))
        mask = train_data["token_mask"][row, span] * train_data["sample_mask"][row]
        fields["loss_mask"] = [int(v > 0) for v in mask.tolist()]
        if "prev_logprobs" in train_data:
            fields["trainer_logprobs"] = _rounded(train_data["prev_logprobs"][row, span])
    return fields


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(v, 4) for v in values.float().tolist()]


def print_samples(rows: list[dict[str, Any]], title: str) -> None:
    """Print prompt, response and reward of each row to the console (``logger.num_val_samples_to_print``).

    Model text is printed verbatim: rich markup and highlighting are off, so brackets in a response stay as is.
    """
    for i, row in enumerate(rows, start=1):
        console.print(f"{title} {i}/{len(rows)} (reward {row['reward']:g})", style="bold")
        console.print(f"  prompt: {row['prompt']}\n  response: {row['response']}", markup=False, highlight=False)
