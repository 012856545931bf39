"""The DTensor policy backend: `DTensorPolicyWorker` (FSDP2 + DTensor TP), its sharding, LoRA, context parallelism
and the bf16 backward."""
