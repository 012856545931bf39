"""Chat templates a config can name (NeMo-RL's ``nemo_rl.data.chat_templates``).

``tokenizer.chat_template: null`` selects `COMMON_CHAT_TEMPLATES.passthrough_prompt_response` (NeMo-RL's meaning):
the messages' contents concatenated, no role markup or special tokens, for models trained on plain text.
"""

from __future__ import annotations


class COMMON_CHAT_TEMPLATES:  # NeMo-RL's name
    # "<|start_header_id|>role<|end_header_id|>\n\n" + trimmed content + "<|eot_id|>" per message, BOS before the
    # first, and the assistant header as generation prompt (Llama 3's markup without its system preamble).
    simple_role_header = (
        "{% for message in messages %}"
        "{% if loop.first %}{{ bos_token }}{% endif %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim }}"
        "{{ '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    )
    # The contents, concatenated.
    passthrough_prompt_response = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
