"""The Megatron generation backend (``policy.generation.backend: megatron``): the Megatron policy's workers sample
with their own model (`megatron_generation.MegatronGeneration`)."""
