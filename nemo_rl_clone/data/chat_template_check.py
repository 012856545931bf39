"""Is a tokenizer's chat template append-only, as multi-turn rollouts need?

A multi-turn rollout never re-templates its conversation: it templates the first prompt
(`get_formatted_message_log`), appends the engine's tokens of each assistant turn as generated, then each
observation as `observation_message` encodes it (the assistant turn's closing, the message, the next assistant
header). The trainer therefore sees those tokens. They equal what ``apply_chat_template`` gives for the whole
conversation only if templating a longer conversation never changes the text of its earlier turns; templates that
drop earlier reasoning, number the turns or move the system prompt do not, and training would then score tokens
the engine was never prompted with.

    check_append_only(tokenizer)   # None, or one line naming the turn where the tokens diverge
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Three user turns, two assistant replies: the first divergence shows by the third turn.
PROBE_CONVERSATION = (
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "4 + 4 = 8."},
    {"role": "user", "content": "Thanks. Now 1 + 1?"},
)


def check_append_only(
    tokenizer: Any,
    conversation: Sequence[Mapping[str, str]] = PROBE_CONVERSATION,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> str | None:
    """None if templating ``conversation`` turn by turn, as a rollout does, gives the token prefix of templating it
    whole after every turn; else one line naming the first turn where they differ (and the tokenizer by ``name``,
    default its path)."""
    from nemo_rl_clone.data.llm_message_utils import get_formatted_message_log, observation_message

    name = name or getattr(tokenizer, "name_or_path", "?")
    kwargs = dict(chat_template_kwargs or {})
    try:
        first = get_formatted_message_log(
            list(conversation[:1]),
            tokenizer,
            add_bos_token=False,  # as the prompt processors template a prompt (data/processors.py)
            add_eos_token=False,
            add_generation_prompt=True,
            chat_template_kwargs=kwargs,
        )
    except ValueError as error:
        return f"chat template of {name!r}: {error}"
    tokens = [int(t) for message in first for t in message["token_ids"].tolist()]
    eos_id = tokenizer.eos_token_id
    for turn in range(1, len(conversation), 2):
        reply, observation = conversation[turn], conversation[turn + 1] if turn + 1 < len(conversation) else None
        generated = tokenizer.encode(reply["content"], add_special_tokens=False)
        ended_with_eos = eos_id is not None and _closing_starts_with_eos(tokenizer)
        if ended_with_eos:
            generated.append(eos_id)  # the engine stops on the end-of-turn token and keeps it
        tokens += generated
        if observation is None:
            break
        try:
            tokens += observation_message(dict(observation), tokenizer, ended_with_eos)["token_ids"].tolist()
        except ValueError:
            return (
                f"chat template of {name!r} is not append-only: it renders the earlier turns differently once turn "
                f"{turn + 2} ({observation['role']}) follows, so observations cannot be appended turn by turn"
            )
        whole = tokenizer.apply_chat_template(
            [dict(m) for m in conversation[: turn + 2]], tokenize=True, add_generation_prompt=True, **kwargs
        )
        whole = list(whole["input_ids"] if isinstance(whole, Mapping) else whole)
        if tokens != whole:
            at = next((i for i, (a, b) in enumerate(zip(tokens, whole, strict=False)) if a != b), None)
            at = min(len(tokens), len(whole)) if at is None else at
            return (
                f"chat template of {name!r} is not append-only: templating turn by turn diverges from templating "
                f"the whole conversation at turn {turn + 2} (token {at}: {_show(tokenizer, tokens, at)} vs "
                f"{_show(tokenizer, whole, at)}), so multi-turn rollouts would train on tokens the engine never saw"
            )
    return None


def _closing_starts_with_eos(tokenizer: Any) -> bool:
    from nemo_rl_clone.data.llm_message_utils import assistant_turn_closing

    eos = tokenizer.eos_token
    return bool(eos) and assistant_turn_closing(tokenizer, assistant_ended_with_eos=False).startswith(eos)


def _show(tokenizer: Any, ids: list[int], at: int) -> str:
    return repr(tokenizer.decode(ids[at : at + 6])) if at < len(ids) else "<end>"
