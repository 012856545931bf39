"""The training contract: what the policy workers, the losses, the generation engines and the environments agree on,
below all of them so that each side imports it and none imports the other.

- `loss`: the loss protocol (`LossFunction`, `LossType`, `TokenLogprobs`).
- `sampling`: the sampler's processing the trainer reproduces (`TrainingSamplingParams`, top-k/top-p).
- `logprobs`: token logprobs from (vocab-parallel, chunked) logits under that processing.
- `loss_input`: from a model's logits to what a loss reads (`prepare_loss_input`).
- `episode`: the records a served call and a rollout message carry (`EPISODE_HEADER`, `ServedCall`,
  `GENERATION_LOGPROBS`).

It imports only `utils` and `distributed`.
"""
