"""Keys of NeMo-RL v0.7.0's recipes for features this library does not build, so that a NeMo-RL recipe stops with
``<key>: not supported yet: <what>`` instead of ``unknown key``.

Each entry is a pattern of full dotted keys (``fnmatch``: ``*`` spans dots) with what the key switches on and the
values at which it switches nothing on (NeMo-RL's default, which is what happens here anyway). Those values are
accepted and dropped; any other value is refused. A typo matches no pattern and stays ``unknown key``.
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any, NamedTuple


class Unsupported(NamedTuple):
    what: str  # the feature, as the refusal names it
    inert: tuple[Any, ...] = ()  # values that leave the feature off


_MODELOPT = "ModelOpt quantization-aware training"
_XTOKEN = "off-policy (cross-tokenizer) distillation from a teacher's stored outputs"
_NEMO_GYM = "NeMo-Gym environments"
_MULTIMODAL = "vision and audio inputs (vision-language / audio-language models)"

UNSUPPORTED_KEYS: dict[str, Unsupported] = {
    # vLLM engine options: the engines here are in-process, one per bundle, with their tokenizer.
    "*generation.vllm_cfg.distributed_executor_backend": Unsupported("choosing vLLM's executor backend", (None,)),
    "*generation.vllm_cfg.skip_tokenizer_init": Unsupported("engines without a tokenizer", (False,)),
    "*generation.vllm_cfg.enforce_monotonicity": Unsupported("vLLM's monotonic-logprob check", (False,)),
    "*generation.vllm_cfg.enable_thinking": Unsupported("the chat template's thinking switch on the engines", (False,)),
    "*generation.vllm_cfg.reasoning_parser_plugin": Unsupported("vLLM reasoning-parser plugins", (None,)),
    "*generation.vllm_cfg.limit_mm_per_prompt": Unsupported(_MULTIMODAL, (None, {})),
    "*generation.bad_words": Unsupported("banned words in generation", (None, [])),
    "*generation.sglang_cfg": Unsupported("the SGLang generation backend; use policy.generation.backend: vllm"),
    "policy.generation.use_async_rollouts": Unsupported("asynchronous rollouts inside a step", (False,)),
    "*tokenizer.video": Unsupported(_MULTIMODAL),
    # ModelOpt quantization (NeMo-RL's QAT recipes).
    "policy.quant_calib_data": Unsupported(_MODELOPT, (None,)),
    "policy.quant_calib_size": Unsupported(_MODELOPT, (None,)),
    "policy.quant_batch_size": Unsupported(_MODELOPT, (None,)),
    "policy.quant_sequence_length": Unsupported(_MODELOPT, (None,)),
    "policy.disable_modelopt_layer_spec": Unsupported(_MODELOPT, (False, None)),
    # MoE extras (MoE models train on both backends without them).
    "policy.dtensor_cfg.moe_parallelizer": Unsupported(
        "NeMo Automodel's MoE parallelizer (the DTensor backend shards Hugging Face MoE layers with FSDP2)", (None, {})
    ),
    "policy.megatron_cfg.track_moe_metrics": Unsupported("MoE router metrics in the Megatron backend", (False,)),
    # Megatron training-loop options of Megatron-Bridge that NeMo-RL passes through.
    "policy.megatron_cfg.distributed_data_parallel_config.average_in_collective": Unsupported(
        "averaging inside the gradient all-reduce (gradients are summed, then scaled)", (False,)
    ),
    # NeMo-RL's checkpointing keys of its NeMo Automodel and Megatron-Bridge integrations.
    "checkpointing.model_cache_dir": Unsupported("NeMo Automodel's consolidated-checkpoint model cache", ("", None)),
    "checkpointing.model_repo_id": Unsupported("NeMo Automodel's consolidated-checkpoint model cache", ("", None)),
    "checkpointing.is_peft": Unsupported("NeMo Automodel's PEFT checkpoints", (False,)),
    "checkpointing.peft_config": Unsupported("NeMo Automodel's PEFT checkpoints", (None,)),
    "checkpointing.is_async": Unsupported("asynchronous checkpoint saving", (False,)),
    "checkpointing.pretrained_checkpoint": Unsupported(
        "initial weights from a Megatron checkpoint (the policy starts from policy.model_name)", (None,)
    ),
    "sif_dir": Unsupported(f"container images for {_NEMO_GYM}", (None,)),
    "env.math.stop_strings": Unsupported("stop strings set by the math environment", (None,)),
    # The code environment here scores a program against its tests in one turn, which always ends the episode.
    "env.code.terminate_on_evaluation": Unsupported("multi-turn code execution (the episode going on)", (True,)),
    # Where the advantages are computed: same numbers either way.
    "grpo.calculate_advantages_on_gpu": Unsupported("", (False, True)),
    # GRPO options of NeMo-RL's NeMo-Gym and agentic recipes.
    # NeMo-Gym flags the messages these act on; NeMo-RL refuses them without NeMo-Gym.
    "grpo.invalid_tool_call_strategy": Unsupported(f"penalising invalid tool calls flagged by {_NEMO_GYM}", (None, "")),
    "grpo.penalize_invalid_tool_call": Unsupported(f"penalising invalid tool calls flagged by {_NEMO_GYM}", (False,)),
    "grpo.penalize_malformed_thinking": Unsupported(f"penalising malformed thinking flagged by {_NEMO_GYM}", (False,)),
    "data.default.dataset_name": Unsupported(f"a default dataset for every split ({_NEMO_GYM})", (None,)),
    # Multiple datasets per run.
    "data.num_prompts_per_dataloader": Unsupported("several training dataloaders in one run"),
    "data.custom_dataloader": Unsupported("several training dataloaders in one run", (None,)),
    "data.train.download_dir": Unsupported(f"downloaded training datasets ({_MULTIMODAL})", (None,)),
    # Off-policy distillation (NeMo-RL's xtoken recipes).
    "teachers": Unsupported("several teachers (multi-teacher distillation)", (None, [])),
    "loss_fn.gold_loss": Unsupported(_XTOKEN, (False,)),
    "loss_fn.xtoken_loss": Unsupported(_XTOKEN, (False,)),
    "loss_fn.temperature": Unsupported(_XTOKEN, (1, 1.0)),
    "loss_fn.vocab_topk": Unsupported(_XTOKEN),
    "loss_fn.uncommon_topk": Unsupported(_XTOKEN),
    "loss_fn.reverse_kl": Unsupported(_XTOKEN, (False,)),
    "loss_fn.exact_token_match_only": Unsupported(_XTOKEN, (False,)),
    "loss_fn.kl_loss_weight": Unsupported(_XTOKEN),
    "loss_fn.ce_loss_scale": Unsupported(_XTOKEN),
    "loss_fn.dynamic_loss_scaling": Unsupported(_XTOKEN),
    "loss_fn.kd_loss_mode": Unsupported(_XTOKEN),
    "loss_fn.sum_weights_metric": Unsupported(_XTOKEN, (None,)),
    "loss_fn.alpha": Unsupported(_XTOKEN),
    "loss_fn.normalize_teacher_by_vocab": Unsupported(_XTOKEN, (False,)),
    "data.train.processor": Unsupported(_XTOKEN),
    "data.train.data_files": Unsupported(_XTOKEN),
    "data.train.text_key": Unsupported(_XTOKEN),
    "data.train.characters_per_sample": Unsupported(_XTOKEN),
    "data.env_name": Unsupported(f"evaluation environments other than math ({_MULTIMODAL})", ("math",)),
}


# Values of keys this library has that select a NeMo-RL feature it does not build: (key, test of the value, what).
UNSUPPORTED_VALUES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "teacher",
        lambda v: v is None,
        "distillation without a `teacher` section (NeMo-RL's off-policy form: `teachers`)",
    ),
    ("data.train", lambda v: isinstance(v, list), "several training datasets in one run (a list); give one"),
    ("data.validation", lambda v: isinstance(v, list), "several validation datasets in one run (a list); give one"),
    (
        "data.max_input_seq_length",
        lambda v: v is None,
        "no prompt length limit (null, NeMo-RL's NeMo-Gym value); set one up to policy.max_total_sequence_length",
    ),
)


# Values of sections this library has that mean "the default" in NeMo-RL's recipes (the section left out).
DEFAULT_VALUES: tuple[tuple[str, Any], ...] = (("data_plane", None),)


def refused_value(dotted_key: str, value: Any) -> str | None:
    """For a known key: ``""`` when ``value`` means its default (drop it), the problem line when it selects an
    unbuilt NeMo-RL feature, else None (validate it as usual)."""
    if any(key == dotted_key and value is default for key, default in DEFAULT_VALUES):
        return ""
    for key, refused, what in UNSUPPORTED_VALUES:
        if key == dotted_key and refused(value):
            return f"{dotted_key}: not supported yet: {what}"
    return None


def unsupported(dotted_key: str) -> Unsupported | None:
    """The entry whose pattern matches ``dotted_key``, or None (then the key is simply unknown)."""
    for pattern, entry in UNSUPPORTED_KEYS.items():
        if fnmatchcase(dotted_key, pattern):
            return entry
    return None


def refusal(dotted_key: str, value: Any) -> str | None:
    """How validation treats a key no schema has: None to drop it (an inert value of a known NeMo-RL key), else the
    problem line (``not supported yet: ...`` for NeMo-RL's keys, ``unknown key`` for anything else; the caller adds
    its suggestion to the latter)."""
    entry = unsupported(dotted_key)
    if entry is None:
        return f"{dotted_key}: unknown key"
    if any(value == inert and type(value) is type(inert) for inert in entry.inert):
        return None
    return f"{dotted_key}: not supported yet: {entry.what} (NeMo-RL's key, set to {value!r})"
