"""Megatron Core pieces of the Megatron policy backend: HF ↔ Megatron conversion and model/optimizer building."""
