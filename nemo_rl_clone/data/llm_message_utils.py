"""Message logs: chat templating into per-message tokens, loss masks and flattening into padded batches.

See :mod:`nemo_rl_clone.data.interfaces` for the message-log format. The invariant kept here: concatenating the
``token_ids`` of a templated message log gives exactly ``tokenizer.apply_chat_template(messages, tokenize=True)``;
generated tokens enter a log as generated (:func:`message_from_token_ids`), never re-tokenised from text.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from nemo_rl_clone.data.interfaces import LLMMessageLogType, TaskDataSpec
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

Tensor = torch.Tensor  # NeMo-RL's names
TokenizerType = PreTrainedTokenizerBase
# NeMo-RL's wire format of message logs between actors, used only by its rollout actor's writes to the data plane.
_DATA_PLANE = "message logs written to the data plane by a rollout actor (the driver runs the rollouts here)"
__getattr__ = refusing_getattr(
    __name__,
    dict.fromkeys(
        ("MESSAGE_LOG_BULK_FIELDS", "decompose_message_log", "attach_message_log_view", "reconstruct_message_log"),
        _DATA_PLANE,
    ),
)

VALID_ROLES = ("system", "user", "assistant", "environment", "tool")
# Chat templates know no "environment" role: observations are rendered as user turns.
_TEMPLATE_ROLE = {"environment": "user"}
# Stand-in assistant text for finding where a template closes an assistant turn.
_PROBE = "PROBE-ASSISTANT-TEXT-7f3a"
_PROBE_CONVERSATION = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}]


def get_formatted_message_log(
    message_log: Sequence[Mapping[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    task_data_spec: TaskDataSpec | None = None,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    debug: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> LLMMessageLogType:
    """Chat-template ``message_log`` once and split the result into per-message text and tokens.

    Args:
        message_log: ``[{"role", "content"}, ...]`` with roles from :data:`VALID_ROLES`.
        tokenizer: a fast tokenizer with a chat template.
        task_data_spec: when it has a prompt template, the first user message's content is formatted with it.
        add_bos_token: prepend the tokenizer's BOS token to the first message unless the template already starts
            with it (nothing for a tokenizer without one).
        add_eos_token: append the EOS token to the last message unless it already ends with it (before trailing
            newlines). Leave it off for prompts: the model continues after the generation prompt.
        add_generation_prompt: give each user message the template's assistant header that follows it (NeMo-RL's
            meaning): a prompt ending in a user message gets the header to generate after; in a conversation, the
            header before each assistant reply belongs to the user message, so SFT trains only on the reply.
        tools: tool (function) schemas the chat template renders, as ``apply_chat_template(tools=...)`` takes them.
        debug: print each templated message (role and text).
        chat_template_kwargs: extra keyword arguments for ``apply_chat_template`` (e.g. ``enable_thinking``).

    Returns:
        One dict per input message: ``role``, ``content`` (that message's slice of the templated text, including
        template markup) and ``token_ids`` (1-D long tensor). Without added BOS/EOS the ``token_ids`` concatenate to
        the tokenisation of the whole templated text, so boundary merges can never differ from what the model is
        prompted with.

    Raises:
        ValueError: empty ``messages``, a bad role or content, a tokenizer without chat template or offsets, or a
            template whose rendering of a prefix of the conversation is not a prefix of the full rendering.
    """
    messages = _checked_messages(_with_task_prompt(message_log, task_data_spec), tokenizer)
    template_kwargs = {**(chat_template_kwargs or {}), **({} if tools is None else {"tools": list(tools)})}
    full_text, ends = _render_with_message_ends(messages, tokenizer, add_generation_prompt, template_kwargs)
    formatted = _split_by_message(messages, full_text, ends, tokenizer)
    if add_bos_token:
        _add_special_token(formatted[0], tokenizer.bos_token, tokenizer.bos_token_id, at_start=True)
    if add_eos_token:
        _add_special_token(formatted[-1], tokenizer.eos_token, tokenizer.eos_token_id, at_start=False)
    if debug:
        for index, message in enumerate(formatted):
            print(f"[{index}] {message['role']}: {message['content']!r}")
    return formatted


def _checked_messages(messages: list[Mapping[str, str]], tokenizer: PreTrainedTokenizerBase) -> list[Mapping[str, str]]:
    """``messages`` unchanged once they and ``tokenizer`` are fit for per-message templating."""
    if not messages:
        raise ValueError("get_formatted_message_log: message_log is empty")
    for i, message in enumerate(messages):
        if message.get("role") not in VALID_ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {VALID_ROLES}, got {message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{i}]['content'] must be a str, got {type(message.get('content')).__name__}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no chat template; set one before templating")
    if not tokenizer.is_fast:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} is not a fast tokenizer (offsets are needed)")
    return messages


def _render_with_message_ends(
    messages: list[Mapping[str, str]],
    tokenizer: PreTrainedTokenizerBase,
    add_generation_prompt: bool,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> tuple[str, list[int]]:
    """The templated conversation and where each message's text ends in it (each prefix rendered on its own)."""
    template_messages = [{"role": _TEMPLATE_ROLE.get(m["role"], m["role"]), "content": m["content"]} for m in messages]
    kwargs = dict(chat_template_kwargs or {})

    def render(upto: int, generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            template_messages[:upto], tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
        assert isinstance(text, str)  # tokenize=False renders text
        return text

    def header_after(upto: int) -> bool:
        return add_generation_prompt and template_messages[upto - 1]["role"] == "user"  # environment turns too

    full_text = render(len(messages), header_after(len(messages)))
    ends: list[int] = []
    for upto in range(1, len(messages)):
        prefix = render(upto, header_after(upto))
        if not full_text.startswith(prefix) or (ends and len(prefix) < ends[-1]):
            raise ValueError(
                f"the chat template of {tokenizer.name_or_path!r} renders messages[:{upto}] as text that is not a "
                "prefix of the whole conversation, so it cannot be split per message"
            )
        ends.append(len(prefix))
    ends.append(len(full_text))
    return full_text, ends


def _split_by_message(
    messages: list[Mapping[str, str]], full_text: str, ends: list[int], tokenizer: PreTrainedTokenizerBase
) -> LLMMessageLogType:
    """Tokenise ``full_text`` once and give each message its text slice and the tokens that start in it."""
    encoding = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    token_ids: list[int] = encoding["input_ids"]
    owner = [_message_index(start, ends) for start, _ in encoding["offset_mapping"]]
    formatted: LLMMessageLogType = []
    text_start = 0
    for i, message in enumerate(messages):
        ids = [tok for tok, who in zip(token_ids, owner, strict=True) if who == i]
        formatted.append(
            {
                "role": message["role"],
                "content": full_text[text_start : ends[i]],
                "token_ids": torch.tensor(ids, dtype=torch.long),
            }
        )
        text_start = ends[i]
    return formatted


def _with_task_prompt(
    messages: Sequence[Mapping[str, str]], task_data_spec: TaskDataSpec | None
) -> list[Mapping[str, str]]:
    messages = list(messages)
    if task_data_spec is None or task_data_spec.prompt is None:
        return messages
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is not None and isinstance(messages[first_user].get("content"), str):
        message = messages[first_user]
        messages[first_user] = {**message, "content": task_data_spec.format_prompt(message["content"])}
    return messages


def _add_special_token(message: dict[str, Any], token: str | None, token_id: int | None, at_start: bool) -> None:
    """Add a BOS (``at_start``) or EOS token to one templated message, text and id together."""
    if token is None or token_id is None:
        return
    text = message["content"]
    if at_start and not text.startswith(token):
        message["content"] = token + text
        message["token_ids"] = torch.cat([torch.tensor([token_id]), message["token_ids"]])
    elif not at_start and not text.rstrip("\n").endswith(token):
        message["content"] = text + token
        message["token_ids"] = torch.cat([message["token_ids"], torch.tensor([token_id])])


def _message_index(char_start: int, ends: list[int]) -> int:
    """Index of the first message whose text ends after ``char_start``."""
    return min(bisect.bisect_right(ends, char_start), len(ends) - 1)


def message_from_token_ids(
    role: str,
    token_ids: torch.Tensor | Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    skip_special_tokens: bool = False,
) -> dict[str, Any]:
    """A message holding ``token_ids`` exactly as given (e.g. generated tokens); ``content`` is their decoding.

    The ids are never re-derived from ``content``: decode→encode is not the identity for BPE tokenizers.
    """
    if role not in VALID_ROLES:
        raise ValueError(f"role must be one of {VALID_ROLES}, got {role!r}")
    ids = torch.as_tensor(token_ids, dtype=torch.long).detach().clone().cpu()
    if ids.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(ids.shape)}")
    content = tokenizer.decode(ids.tolist(), skip_special_tokens=skip_special_tokens)
    return {"role": role, "content": content, "token_ids": ids}


def observation_message(
    observation: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase, assistant_ended_with_eos: bool
) -> dict[str, Any]:
    """An environment's reply ``{"role", "content"}``, as the next message of a rollout after an assistant turn.

    Its text is what the chat template puts between the assistant's content and the next assistant turn: the rest of
    the assistant turn's closing (the whole closing, e.g. ``<|im_end|>\n``, when generation stopped on a stop string
    rather than the end-of-turn token), then the ``role`` message and the assistant header. Encoded on its own and
    appended as is: the trainer sees exactly the tokens the engine is prompted with next. Roles: ``user``, ``tool``,
    ``environment`` (rendered as ``user``).
    """
    role, content = observation.get("role", "environment"), observation.get("content")
    if role not in ("user", "tool", "environment") or not isinstance(content, str):
        raise ValueError(
            f"an observation must be {{'role': 'user' | 'tool' | 'environment', 'content': str}}, got role {role!r} "
            f"and content of type {type(content).__name__}"
        )
    before = tokenizer.apply_chat_template(_PROBE_CONVERSATION, tokenize=False)
    after = tokenizer.apply_chat_template(
        [*_PROBE_CONVERSATION, {"role": _TEMPLATE_ROLE.get(role, role), "content": content}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert isinstance(before, str) and isinstance(after, str)  # tokenize=False renders text
    if not after.startswith(before):
        raise ValueError(
            f"the chat template of {tokenizer.name_or_path!r} renders a conversation differently once a {role!r} "
            "message follows, so observations cannot be appended turn by turn"
        )
    text = assistant_turn_closing(tokenizer, assistant_ended_with_eos) + after[len(before) :]
    token_ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)
    return {"role": role, "content": text, "token_ids": token_ids}


def assistant_turn_closing(tokenizer: PreTrainedTokenizerBase, assistant_ended_with_eos: bool) -> str:
    """What the chat template writes after an assistant message's content (e.g. ``<|im_end|>\n``), less the
    end-of-sequence token when the generated text already ends with it: appended to a generated turn, it gives the
    text the template renders for the whole conversation."""
    rendered = tokenizer.apply_chat_template(_PROBE_CONVERSATION, tokenize=False)
    assert isinstance(rendered, str)  # tokenize=False renders text
    closing = rendered[rendered.rindex(_PROBE) + len(_PROBE) :]
    eos = tokenizer.eos_token
    if assistant_ended_with_eos and eos and closing.startswith(eos):
        closing = closing[len(eos) :]
    return closing


def add_loss_mask_to_message_log(
    batch_message_log: Sequence[LLMMessageLogType],
    roles_to_train_on: Sequence[str] = ("assistant",),
    only_unmask_final: bool = False,
) -> None:
    """Add ``token_loss_mask`` (1-D long tensor like ``token_ids``) to every message, in place.

    The mask is 1 on messages whose role is in ``roles_to_train_on`` (case-insensitive) and 0 elsewhere; with
    ``only_unmask_final`` it is 1 on the last message of each log, whatever its role, and 0 elsewhere.
    """
    roles = {role.lower() for role in roles_to_train_on}
    unknown = roles - set(VALID_ROLES)
    if unknown:
        raise ValueError(f"roles_to_train_on has unknown roles {sorted(unknown)}; valid roles: {VALID_ROLES}")
    for sample, message_log in enumerate(batch_message_log):
        for i, message in enumerate(message_log):
            token_ids = _token_ids(message, sample, i)
            trained = i == len(message_log) - 1 if only_unmask_final else message["role"] in roles
            message["token_loss_mask"] = torch.full_like(token_ids, int(trained))


def message_log_to_flat_messages(message_log: LLMMessageLogType) -> dict[str, Any]:
    """Concatenate one message log: tensor keys are concatenated along dim 0, other keys collected in lists.

    A tensor key present in one message (e.g. ``token_loss_mask``) must be present in every message as a 1-D
    tensor with one entry per token, so that all flattened tensors stay aligned with ``token_ids``.
    An empty log flattens to ``{}``.
    """
    tensor_keys = sorted({k for m in message_log for k, v in m.items() if isinstance(v, torch.Tensor)})
    for i, message in enumerate(message_log):
        token_ids = message.get("token_ids")
        num_tokens = token_ids.shape[0] if isinstance(token_ids, torch.Tensor) and token_ids.ndim == 1 else None
        for key in tensor_keys:
            value = message.get(key)
            if not isinstance(value, torch.Tensor) or value.ndim != 1 or value.shape[0] != num_tokens:
                got = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"message {i} (role {message.get('role')!r}): {key!r} must be a 1-D tensor with one entry per "
                    f"token ({num_tokens} tokens), got {got}; other messages of the log have it"
                )
    flat: dict[str, Any] = {key: torch.cat([m[key] for m in message_log]) for key in tensor_keys}
    other_keys = sorted({k for m in message_log for k in m} - set(tensor_keys))
    for key in other_keys:
        flat[key] = [message.get(key) for message in message_log]
    return flat


def batched_message_log_to_flat_message(
    message_log_batch: Sequence[LLMMessageLogType],
    pad_value_dict: Mapping[str, Any] | None = None,
    make_sequence_length_divisible_by: int = 1,
) -> tuple[BatchedDataDict, torch.Tensor]:
    """Flatten and right-pad a batch of message logs.

    Args:
        message_log_batch: B message logs; each must have ``token_ids`` on every message.
        pad_value_dict: pad value per tensor key (default 0), e.g. ``{"token_ids": tokenizer.pad_token_id}``.
        make_sequence_length_divisible_by: round the padded length S up to a multiple of this.

    Returns:
        ``(flat, input_lengths)``: ``flat[key]`` is a ``[B, S]`` tensor for every tensor key (``token_ids``,
        ``token_loss_mask``, ...) and a list of per-message value lists for other keys (``role``, ``content``);
        ``input_lengths`` is a ``[B]`` long tensor of unpadded token counts.
    """
    if make_sequence_length_divisible_by < 1:
        raise ValueError(f"make_sequence_length_divisible_by must be >= 1, got {make_sequence_length_divisible_by}")
    if not message_log_batch:
        raise ValueError("batched_message_log_to_flat_message: message_log_batch is empty")
    flats = []
    for sample, message_log in enumerate(message_log_batch):
        for i, message in enumerate(message_log):
            _token_ids(message, sample, i)
        try:
            flats.append(message_log_to_flat_messages(message_log))
        except ValueError as err:
            raise ValueError(f"sample {sample}, {err}") from None
    tensor_keys = sorted({"token_ids"} | {k for f in flats for k, v in f.items() if isinstance(v, torch.Tensor)})
    other_keys = sorted({k for f in flats for k in f} - set(tensor_keys))
    for sample, (flat, message_log) in enumerate(zip(flats, message_log_batch, strict=True)):
        missing = [key for key in tensor_keys if key not in flat]
        if message_log and missing:  # an empty log has no keys at all and is padded everywhere
            raise ValueError(f"sample {sample} lacks tensor key(s) {missing} that other samples have")

    input_lengths = torch.tensor([len(flat.get("token_ids", ())) for flat in flats], dtype=torch.long)
    divisor = make_sequence_length_divisible_by
    padded_len = -(-int(input_lengths.max()) // divisor) * divisor
    pad_values = dict(pad_value_dict or {})
    batch = BatchedDataDict()
    for key in tensor_keys:
        dtype = next((flat[key].dtype for flat in flats if key in flat), torch.long)
        padded = torch.full((len(flats), padded_len), pad_values.get(key, 0), dtype=dtype)
        for row, flat in enumerate(flats):
            if key in flat:
                padded[row, : flat[key].shape[0]] = flat[key]
        batch[key] = padded
    for key in other_keys:
        batch[key] = [flat.get(key, []) for flat in flats]
    return batch, input_lengths


def get_keys_from_message_log(message_log: LLMMessageLogType, keys: Sequence[str]) -> LLMMessageLogType:
    """A copy of ``message_log`` keeping only ``keys`` in each message (missing keys are skipped)."""
    return [{k: message[k] for k in keys if k in message} for message in message_log]


def message_log_shape(message_log: LLMMessageLogType) -> list[dict[str, Any]]:
    """Per message, the shape of each tensor value (lists of message logs are described recursively)."""
    shapes: list[dict[str, Any]] = []
    for message in message_log:
        shape: dict[str, Any] = {}
        for key, value in message.items():
            if isinstance(value, torch.Tensor):
                shape[key] = value.shape
            elif isinstance(value, list):
                shape[key] = [message_log_shape(item) for item in value]
        shapes.append(shape)
    return shapes


def get_first_index_that_differs(str1: str, str2: str) -> int:
    """Index of the first differing character; the shorter length when one string is a prefix of the other."""
    return next((i for i, (a, b) in enumerate(zip(str1, str2, strict=False)) if a != b), min(len(str1), len(str2)))


def remap_dataset_keys(dataset: Any, mapping_dict: Mapping[str, str]) -> Any:
    """A Hugging Face ``datasets.Dataset`` with columns renamed by ``mapping_dict`` (old -> new); the same
    dataset when nothing changes. KeyError naming the columns when a mapped column is missing."""
    renames = {old: new for old, new in mapping_dict.items() if old != new}
    if not renames:
        return dataset
    missing = sorted(set(renames) - set(dataset.column_names))
    if missing:
        raise KeyError(
            f"remap_dataset_keys: columns {missing} are not in the dataset (columns: {dataset.column_names})"
        )
    return dataset.rename_columns(renames)


def _token_ids(message: Mapping[str, Any], sample: int, index: int) -> torch.Tensor:
    token_ids = message.get("token_ids")
    if not isinstance(token_ids, torch.Tensor) or token_ids.ndim != 1:
        raise ValueError(
            f"sample {sample}, message {index} (role {message.get('role')!r}): 'token_ids' must be a 1-D tensor, "
            f"got {type(token_ids).__name__}"
        )
    return token_ids
