"""The kit the policy workers share: train step, optimizers, sequence packing, token logprob head, top-k logits,
refit sender, reward-model head, process setup and training profile."""
