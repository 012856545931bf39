"""The facade tables: `FACADES`, modules that exist only to present another module under a second path — NeMo-RL
v0.7.0's path (so that its users' imports read the same here) or an earlier path of ours (so that old imports keep
working); `REFUSED`, modules at NeMo-RL's paths for features not built here, which stop with one line when imported.

A facade may import any layer; a refused module imports only the refusal helper; nothing inside `nemo_rl_clone`
imports either (it imports what the facade presents). ``tests/unit/test_import_layers.py`` holds these rules and reads
both tables; no module outside them is exempt.
"""

from __future__ import annotations

# facade module → the module it presents
FACADES: dict[str, str] = {
    # NeMo-RL's path (nemo_rl.data.utils): its data setup starts environments, which the data layer may not import
    "nemo_rl_clone.data.utils": "nemo_rl_clone.algorithms.run.nemo_rl_data",
    # NeMo-RL's path (nemo_rl.algorithms.logits_sampling_utils)
    "nemo_rl_clone.algorithms.logits_sampling_utils": "nemo_rl_clone.contract.sampling",
    # NeMo-RL's path (nemo_rl.algorithms.loss.interfaces)
    "nemo_rl_clone.algorithms.loss.interfaces": "nemo_rl_clone.contract.loss",
    # NeMo-RL's path (nemo_rl.algorithms.loss.utils)
    "nemo_rl_clone.algorithms.loss.utils": "nemo_rl_clone.contract.loss_input",
    # our earlier path of the losses (now nemo_rl_clone.algorithms.loss, NeMo-RL's layout)
    "nemo_rl_clone.algorithms.loss_functions": "nemo_rl_clone.algorithms.loss",
    # our earlier path of the loss configs
    "nemo_rl_clone.algorithms.loss_configs": "nemo_rl_clone.algorithms.loss.configs",
    # our earlier path of the distillation loss
    "nemo_rl_clone.algorithms.distillation_loss": "nemo_rl_clone.algorithms.loss.distillation",
    # NeMo-RL's path (nemo_rl.experience.rollouts)
    "nemo_rl_clone.experience.rollouts": "nemo_rl_clone.rollout.multi_turn",
    # NeMo-RL's path (nemo_rl.algorithms.reward_functions)
    "nemo_rl_clone.algorithms.reward_functions": "nemo_rl_clone.rollout.rewards",
    # NeMo-RL's path (nemo_rl.distributed.ray_actor_environment_registry)
    "nemo_rl_clone.distributed.ray_actor_environment_registry": "nemo_rl_clone.distributed.ray_actor_environment",
    # NeMo-RL's path (nemo_rl.data.datasets.processed_dataset)
    "nemo_rl_clone.data.datasets.processed_dataset": "nemo_rl_clone.data.datasets.common",
    # NeMo-RL's path (nemo_rl.utils.native_checkpoint)
    "nemo_rl_clone.utils.native_checkpoint": "nemo_rl_clone.models.dcp_checkpoint",
}

# NeMo-RL v0.7.0's modules (or packages: the package refuses every module under it) for features this library does
# not build → the feature. Each only calls `nemo_rl_clone.utils.unsupported_modules.refuse_import(__name__, feature)`,
# so importing it stops with one line, `<module>: not supported yet: <feature>`; nothing inside the package imports one.
_NEMO_GYM = "NeMo-Gym environments"
_MULTIMODAL = "vision and audio inputs (vision-language / audio-language models)"
_DATA_PLANE = (
    "a rollout actor writing rollouts to the data plane (the driver runs the rollouts; the trainer's rows go through "
    "the data plane: data_plane.enabled)"
)
_XTOKEN = "off-policy (cross-tokenizer) distillation from a teacher's stored outputs"
_OPD = "on-policy distillation inside GRPO (distillation is its own run: examples/run_distillation_math.py)"
REFUSED: dict[str, str] = {
    "nemo_rl_clone.environments.nemo_gym": _NEMO_GYM,
    "nemo_rl_clone.environments.vlm_environment": _MULTIMODAL,
    "nemo_rl_clone.environments.tools": "the retrieval (BM25) tool environment; tool calls: env.tool_use",
    "nemo_rl_clone.experience.sync_rollout_actor": _DATA_PLANE,
    "nemo_rl_clone.algorithms.x_token": _XTOKEN,
    "nemo_rl_clone.algorithms.xtoken_off_policy_distillation": _XTOKEN,
    "nemo_rl_clone.data.cross_tokenizer_collate": _XTOKEN,
    "nemo_rl_clone.data.datasets.response_datasets.arrow_text_dataset": _XTOKEN,
    **{
        f"nemo_rl_clone.data.datasets.response_datasets.{name}": _MULTIMODAL
        for name in ("clevr", "geometry3k", "refcoco", "mmpr_tiny", "avqa", "audiomcq", "daily_omni")
    },
    # conversations with image, audio and video files beside their text
    "nemo_rl_clone.data.datasets.response_datasets.general_conversations_dataset": _MULTIMODAL,
    "nemo_rl_clone.data.datasets.response_datasets.nemogym_dataset": _NEMO_GYM,
    "nemo_rl_clone.data.datasets.eval_datasets.mmau": _MULTIMODAL,
    "nemo_rl_clone.algorithms.opd": _OPD,
    "nemo_rl_clone.models.policy.teacher_worker_group": _OPD,
    "nemo_rl_clone.models.generation.sglang": "the SGLang generation backend; use policy.generation.backend: vllm",
    # NeMo-RL's Megatron-Core inference engine inside the worker; here the policy worker's `generate` samples
    "nemo_rl_clone.models.generation.megatron.megatron_worker": "Megatron-Core's inference engine (the Megatron "
    "generation backend samples through the policy worker's own forward pass)",
    "nemo_rl_clone.models.generation.megatron.utils": "GPU memory logging of Megatron-Core's inference engine",
    "nemo_rl_clone.models.generation.vllm.quantization": "FP8 generation kernels",
    "nemo_rl_clone.models.generation.vllm.reasoning_parsers": "vLLM reasoning-parser plugins",
    "nemo_rl_clone.models.automodel": "NeMo Automodel (models load through Hugging Face transformers)",
    "nemo_rl_clone.models.megatron.draft": "training a speculative-decoding (EAGLE) draft model",
    "nemo_rl_clone.modelopt": "ModelOpt quantization (quantization-aware training and quantized generation)",
}
