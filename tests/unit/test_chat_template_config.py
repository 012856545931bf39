"""``tokenizer.chat_template`` / ``tokenizer.chat_template_kwargs``: every chat-template rendering sees them — GRPO and
evaluation prompts, SFT conversations, DPO/RM pairs, direct ``apply_chat_template`` calls and the saved tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_rl_clone.data.interfaces import TaskDataSpec
from nemo_rl_clone.data.processors import build_prompt_datum
from nemo_rl_clone.data.supervised import build_preference_datum, build_sft_datum
from nemo_rl_clone.evals.config import EvalMasterConfig
from nemo_rl_clone.evals.eval import load_eval_tokenizer
from nemo_rl_clone.models.huggingface import configure_chat_template, load_tokenizer
from nemo_rl_clone.models.policy.config import TokenizerConfig
from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

MODEL = "tiny-random-llama"  # SmolLM2's tokenizer
# ChatML whose user turns end in "!!" when the template variable `shout` is true.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'user' and shout is defined and shout %}!!{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]


def _tokenizer(**kwargs: Any) -> Any:
    return TokenizerConfig(chat_template=TEMPLATE, chat_template_kwargs=kwargs or None).load(MODEL)


def _text(message_log: list[dict[str, Any]]) -> str:
    return "".join(m["content"] for m in message_log)


def test_kwargs_change_every_templated_text() -> None:
    plain, shouting = _tokenizer(), _tokenizer(shout=True)
    spec = TaskDataSpec("math")
    grpo = [_text(build_prompt_datum("2 + 2?", spec, t, 64, 0, {}, "math")["message_log"]) for t in (plain, shouting)]
    assert grpo == [
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\n2 + 2?!!<|im_end|>\n<|im_start|>assistant\n",
    ]
    sft = _text(build_sft_datum(CHAT, shouting, 64, 0)["message_log"])
    assert sft == "<|im_start|>user\nWhat is 2 + 2?!!<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    pair = build_preference_datum(CHAT[:1], CHAT[1:], [{"role": "assistant", "content": "5"}], shouting, 64, 0)
    assert _text(pair["message_log_chosen"]).startswith("<|im_start|>user\nWhat is 2 + 2?!!<|im_end|>")
    assert shouting.apply_chat_template(CHAT[:1], tokenize=False) == "<|im_start|>user\nWhat is 2 + 2?!!<|im_end|>\n"
    # `shout` false renders like no kwargs at all.
    assert _tokenizer(shout=False).apply_chat_template(CHAT, tokenize=False) == plain.apply_chat_template(
        CHAT, tokenize=False
    )


def test_saved_tokenizer_keeps_kwargs_and_a_later_config_replaces_them(tmp_path) -> None:
    _tokenizer(shout=True).save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.apply_chat_template(CHAT[:1], tokenize=False).endswith("?!!<|im_end|>\n")
    configure_chat_template(reloaded, chat_template_kwargs={"shout": False})
    assert reloaded.apply_chat_template(CHAT[:1], tokenize=False).endswith("?<|im_end|>\n")
    assert reloaded.chat_template.count("{%- set") == 1  # replaced, not stacked


def test_evaluation_applies_the_tokenizer_section() -> None:
    config = validate_config(
        {"tokenizer": {"chat_template": TEMPLATE, "chat_template_kwargs": {"shout": True}}}, EvalMasterConfig
    )
    tokenizer = load_eval_tokenizer(config, MODEL)
    assert tokenizer.apply_chat_template(CHAT[:1], tokenize=False).endswith("?!!<|im_end|>\n")


def test_default_template_keeps_the_tokenizers_own() -> None:
    own = load_tokenizer(MODEL).chat_template
    assert TokenizerConfig(chat_template="default").load(MODEL).chat_template == own
    assert TokenizerConfig().load(MODEL).chat_template == own
    assert validate_config({"tokenizer": {}}, EvalMasterConfig).tokenizer.chat_template == "default"  # left out


def test_null_template_is_the_passthrough_and_a_jinja_path_is_read(tmp_path) -> None:
    """NeMo-RL's meanings of ``tokenizer.chat_template``: null concatenates the contents; ``*.jinja`` is a file."""
    passthrough = validate_config({"tokenizer": {"chat_template": None}}, EvalMasterConfig).tokenizer.load(MODEL)
    assert passthrough.apply_chat_template(CHAT, tokenize=False) == "".join(m["content"] for m in CHAT)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}]{% endfor %}")
    from_file = TokenizerConfig(chat_template=str(template)).load(MODEL)
    assert from_file.apply_chat_template(CHAT, tokenize=False) == "".join(f"[{m['role']}]" for m in CHAT)
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.chat_template: template file"):
        TokenizerConfig(chat_template=str(tmp_path / "missing.jinja")).load(MODEL)


def test_simple_role_header_template() -> None:
    from nemo_rl_clone.data.chat_templates import COMMON_CHAT_TEMPLATES

    tokenizer = TokenizerConfig(chat_template=COMMON_CHAT_TEMPLATES.simple_role_header).load(MODEL)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": " hi "}], tokenize=False, add_generation_prompt=True
    )
    bos = tokenizer.bos_token or ""
    assert text == (
        f"{bos}<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize("key", ["add_generation_prompt", "not-a-name"])
def test_kwargs_that_are_not_template_variables_are_refused(key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        validate_config({"tokenizer": {"chat_template_kwargs": {key: True}}}, EvalMasterConfig)
    assert raised.value.problems == [
        f"tokenizer.chat_template_kwargs.{key}: must be a template variable name (an identifier), not one of "
        "apply_chat_template's own arguments ['messages', 'add_generation_prompt', 'continue_final_message', "
        "'tools', 'documents']"
    ]
