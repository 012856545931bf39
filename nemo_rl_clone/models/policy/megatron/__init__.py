"""The Megatron Core policy backend: `MegatronPolicyWorker`, its ``megatron_cfg`` schema, HF ↔ Megatron conversion,
model/optimizer building and checkpoint export."""
