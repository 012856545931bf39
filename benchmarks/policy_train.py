"""Training throughput of `Policy.train` with each backend (1 DTensor worker, 1 Megatron Core worker; NLLLossFn)
vs a plain single-process HF + AdamW loop.

All three train SmolLM2-135M-Instruct in fp32 on the same fixed batch in the same run, with the same thread count
(a worker's bundle is 1 CPU, so the plain loop also uses 1 thread), alternating step by step so that load from
other processes hits them alike. Warmup steps are excluded; throughput uses the median step time (robust to a
step slowed by another process on a shared machine). Prints raw numbers, then ``megatron_vs_dtensor=<step-time
ratio>`` and ``ratio=<dtensor/plain throughput>`` last.

    uv run --no-sync python benchmarks/policy_train.py [--batch 4] [--seq-len 64] [--steps 5] [--warmup 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from nemo_rl_clone.algorithms.loss import NLLLossFn
from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster, init_ray
from nemo_rl_clone.models.huggingface import SMOLLM2, load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.config import OptimizerConfig, PolicyConfig
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.models.policy.megatron.config import MegatronConfig, MegatronOptimizerConfig, MegatronSchedulerConfig

OPTIMIZER_KWARGS = {"lr": 1e-5, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8}
WORKER_THREADS = 1  # a CPU bundle is 1 CPU; Ray gives its actor OMP_NUM_THREADS=1


def fixed_batch(vocab_size: int, batch: int, seq_len: int) -> BatchedDataDict:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab_size, (batch, seq_len), generator=generator)
    return BatchedDataDict(
        input_ids=input_ids,
        input_lengths=torch.full((batch,), seq_len),
        token_mask=torch.ones(batch, seq_len),
        sample_mask=torch.ones(batch),
    )


class PlainTrainer:
    """The loop a user would write by hand: one forward of the whole batch, NLL, clip, AdamW."""

    def __init__(self, model_path: str, max_grad_norm: float) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model.config.use_cache = False
        kwargs = {**OPTIMIZER_KWARGS, "betas": tuple(OPTIMIZER_KWARGS["betas"])}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), **kwargs)
        self.max_grad_norm = max_grad_norm

    def step(self, data: BatchedDataDict) -> float:
        input_ids = data["input_ids"]
        logits = self.model(input_ids=input_ids, use_cache=False).logits
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
        loss = -(logprobs * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer")
    args = parser.parse_args()

    model_path = resolve_model_path(SMOLLM2)
    tokenizer = load_tokenizer(model_path)
    data = fixed_batch(len(tokenizer), args.batch, args.seq_len)
    config = PolicyConfig(
        model_name=model_path,
        train_global_batch_size=args.batch,
        train_micro_batch_size=args.batch,
        logprob_batch_size=args.batch,
        max_total_sequence_length=args.seq_len,
        precision="float32",
        max_grad_norm=1.0,
        optimizer=OptimizerConfig("torch.optim.AdamW", dict(OPTIMIZER_KWARGS)),
        scheduler=None,
    )
    megatron_config = dataclasses.replace(
        config,
        optimizer=None,
        dtensor_cfg=dataclasses.replace(config.dtensor_cfg, enabled=False),
        megatron_cfg=MegatronConfig(
            enabled=True,
            # Adam with AdamW's settings, a constant learning rate (no warm-up), clipping at max_grad_norm.
            optimizer=MegatronOptimizerConfig(
                lr=OPTIMIZER_KWARGS["lr"], min_lr=OPTIMIZER_KWARGS["lr"], weight_decay=OPTIMIZER_KWARGS["weight_decay"]
            ),
            scheduler=MegatronSchedulerConfig(
                start_weight_decay=OPTIMIZER_KWARGS["weight_decay"],
                end_weight_decay=OPTIMIZER_KWARGS["weight_decay"],
                lr_warmup_iters=0,
                lr_warmup_init=OPTIMIZER_KWARGS["lr"],
                lr_decay_iters=None,
            ),
        ),
    )
    torch.set_num_threads(WORKER_THREADS)
    init_ray()
    cluster = RayVirtualCluster([1], use_gpus=False, name="bench-policy")
    megatron_cluster = RayVirtualCluster([1], use_gpus=False, name="bench-megatron")
    policy = Policy(cluster, config, tokenizer, name_prefix="bench-policy", init_reference_model=False)
    megatron = Policy(
        megatron_cluster, megatron_config, tokenizer, name_prefix="bench-megatron", init_reference_model=False
    )
    plain = PlainTrainer(model_path, config.max_grad_norm)
    loss_fn = NLLLossFn()
    try:
        ours_s, megatron_s, plain_s, ours_losses, megatron_losses, plain_losses = [], [], [], [], [], []
        for step in range(args.warmup + args.steps):
            ours = timed(lambda: ours_losses.append(policy.train(data, loss_fn)["loss"].item()))
            mega = timed(lambda: megatron_losses.append(megatron.train(data, loss_fn)["loss"].item()))
            theirs = timed(lambda: plain_losses.append(plain.step(data)))
            if step >= args.warmup:
                ours_s.append(ours)
                megatron_s.append(mega)
                plain_s.append(theirs)
    finally:
        policy.shutdown()
        megatron.shutdown()
        cluster.shutdown()
        megatron_cluster.shutdown()

    tokens = args.batch * args.seq_len
    ours_tps = tokens / statistics.median(ours_s)
    plain_tps = tokens / statistics.median(plain_s)
    print(
        f"model={SMOLLM2} batch={args.batch}x{args.seq_len} tokens/step={tokens} threads={WORKER_THREADS} "
        f"steps={args.steps} warmup={args.warmup}"
    )
    megatron_tps = tokens / statistics.median(megatron_s)
    for name, times, losses in (
        ("dtensor", ours_s, ours_losses),
        ("megatron", megatron_s, megatron_losses),
        ("plain", plain_s, plain_losses),
    ):
        print(f"{name}_step_s={[round(s, 3) for s in times]} {name}_losses={[round(x, 5) for x in losses]}")
    print(
        f"dtensor_tokens_per_s={ours_tps:.1f} megatron_tokens_per_s={megatron_tps:.1f} "
        f"plain_tokens_per_s={plain_tps:.1f} (median step)"
    )
    print(f"megatron_vs_dtensor={statistics.median(megatron_s) / statistics.median(ours_s):.3f} (step time)")
    print(f"ratio={ours_tps / plain_tps:.3f}")


if __name__ == "__main__":
    main()
