"""On-policy distillation: generate → teacher top-k → train the student → sync weights → validate → checkpoint → log.

The student (``policy``) samples responses with vLLM exactly as GRPO's policy does; a frozen teacher (``teacher``,
a second `Policy` sharing the training cluster's bundles) returns its top-k logits at every position of those
samples, and the student is trained to match that distribution (`DistillationLossFn`: forward, reverse or mixed KL).
Everything but the teacher and the loss is the rollout run every RL algorithm builds (`run.rollout.setup_rollout_run`;
rollouts, validation, refit, checkpoints and logging are the shared functions), so distillation samples, validates and
resumes as GRPO does. Environment rewards are computed and logged
(``train/reward``) but never trained on. See docs/distillation.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PreTrainedTokenizerBase

from nemo_rl_clone.algorithms.distillation.config import DistillationConfig, DistillationMasterConfig
from nemo_rl_clone.algorithms.loss.registry import build_loss
from nemo_rl_clone.algorithms.run.loop import StepResult, train_loop
from nemo_rl_clone.algorithms.run.rollout import GivenParts, RolloutAlgorithm, step_performance
from nemo_rl_clone.algorithms.run.second_model import SyncRolloutSteps, setup_with_model
from nemo_rl_clone.algorithms.run.state import save_run_checkpoint
from nemo_rl_clone.algorithms.utils import reduce_train_results
from nemo_rl_clone.contract.loss import LossFunction
from nemo_rl_clone.contract.sampling import TrainingSamplingParams
from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.rollout.batches import build_train_batch
from nemo_rl_clone.rollout.run import RolloutRun
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.progress import console, phase
from nemo_rl_clone.utils.samples import sample_rows
from nemo_rl_clone.utils.timer import Timer

__all__ = [
    "DistillationComponents",
    "DistillationConfig",
    "DistillationMasterConfig",
    "MasterConfig",
    "check_vocab_equality",
    "distillation_train",
    "setup",
]

# NeMo-RL's name for the whole-run schema.
MasterConfig = DistillationMasterConfig

# NeMo-RL's switch for teachers whose tokenizer differs only in ways the check cannot see past.
SKIP_TOKENIZER_CHECK_ENV = "NRL_SKIP_DISTILLATION_TOKENIZER_CHECK"
# Loss metrics that are each microbatch's share of the global mean (see `distillation_loss`).
_SHARE_METRICS = ("loss", "kl_forward", "kl_reverse")


@dataclass
class DistillationComponents:
    config: DistillationMasterConfig
    run: RolloutRun[DistillationMasterConfig]  # the student's: policy, engines, data, environments, logger, state
    teacher: Policy
    loss_fn: LossFunction

    def shutdown(self) -> None:
        self.teacher.shutdown()
        self.run.shutdown()


def setup(
    config: DistillationMasterConfig | Mapping[str, Any], given: GivenParts | None = None
) -> DistillationComponents:
    """Build a distillation run from a config (validated here when given as NeMo-RL's plain dict); resumes the
    student from ``checkpointing.checkpoint_dir`` if it holds a checkpoint (the teacher always loads
    ``teacher.model_name``). ``given``: the tokenizer and datasets a NeMo-RL-style caller built
    (`distillation.nemo_rl_api.setup`)."""
    config = as_config(config, DistillationMasterConfig)
    check_vocab_match(config)  # before Ray starts: a mismatch is one line, not a failed run
    run, teacher = setup_with_model(
        config,
        None,  # the student trains with the distillation loss (`DistillationComponents.loss_fn`)
        lambda run, env_vars: Policy(
            run.clusters[0],
            config.teacher,
            run.tokenizer,
            name_prefix="teacher",
            init_optimizer=False,
            init_reference_model=False,
            env_vars=env_vars,
        ),
        given,
    )
    sampling = TrainingSamplingParams.from_generation(config.policy.generation)
    loss_fn = build_loss(config.loss_fn.name, "distillation", config.loss_fn.loss_config(), sampling)
    return DistillationComponents(config, run, teacher, loss_fn)


def check_vocab_match(config: DistillationMasterConfig) -> None:
    """`check_vocab_equality` of a run's student and teacher (their tokenizers as the config names them); skipped
    with ``NRL_SKIP_DISTILLATION_TOKENIZER_CHECK=true``."""
    if os.environ.get(SKIP_TOKENIZER_CHECK_ENV, "").lower() in ("1", "true", "yes"):
        return
    student, teacher = config.policy, config.teacher
    check_vocab_equality(
        student.tokenizer.load(student.model_name),
        student.model_name,
        teacher.model_name,
        teacher_tokenizer=teacher.tokenizer.load(teacher.model_name),
    )


def check_vocab_equality(
    tokenizer: PreTrainedTokenizerBase,
    student_model_name: str,
    teacher_model_name: str,
    teacher_tokenizer: PreTrainedTokenizerBase | None = None,
) -> None:
    """The student's loss reads the teacher's top-k ids as its own: both tokenizers must map the same tokens to the
    same ids, and both models must have the same logits width (``vocab_size``). NeMo-RL's check and signature;
    ``teacher_tokenizer`` defaults to the teacher model's own. Raises `UserInputError` naming ``teacher.model_name``."""
    hint = f"(set {SKIP_TOKENIZER_CHECK_ENV}=true to skip this check)"
    if teacher_tokenizer is None:
        teacher_tokenizer = load_tokenizer(teacher_model_name)
    if tokenizer.get_vocab() != teacher_tokenizer.get_vocab() or len(tokenizer) != len(teacher_tokenizer):
        raise UserInputError(
            f"teacher.model_name: {teacher_model_name!r} has a tokenizer whose token -> id map differs from the "
            f"student's ({student_model_name!r}); distillation needs a shared vocabulary {hint}"
        )
    widths = [
        AutoConfig.from_pretrained(resolve_model_path(name)).vocab_size
        for name in (student_model_name, teacher_model_name)
    ]
    if widths[0] != widths[1]:
        raise UserInputError(
            f"teacher.model_name: the teacher's vocab_size ({widths[1]}) differs from the student's ({widths[0]}): "
            f"their logits do not line up {hint}"
        )


def distillation_train(c: DistillationComponents) -> None:
    """Run distillation steps until ``distillation.max_num_steps``, ``max_num_epochs``, the end of the data or the
    save deadline (`run.loop.train_loop`)."""
    train_loop(DistillationSteps(c))


class DistillationSteps(SyncRolloutSteps):
    """Distillation's step for `train_loop`: the student samples (GRPO's synchronous rollouts, so the engines get
    the student's new weights before they next sample or validate), the teacher scores, the student trains."""

    def __init__(self, c: DistillationComponents) -> None:
        super().__init__("Distillation", c.run, c.config.distillation, c.config.checkpointing, c.config.watchdog)
        self.c = c

    def train_step(self, step: int, timer: Timer) -> StepResult | None:
        run, cfg = self.run, self.c.config
        # 1. the student samples num_prompts_per_step x num_generations_per_prompt responses; rewards are logged
        rollouts = self.source.next(step, timer)
        if rollouts is None:
            return None
        no_advantages = torch.zeros(rollouts.batch.size)
        train_data = build_train_batch(rollouts.batch, no_advantages, run.tokenizer, run.config)
        del train_data["advantages"], train_data["generation_logprobs"]

        # 2. the teacher's top-k logits at every position of those samples
        phase(step, "teacher top-k")
        with timer.time("teacher_logprob_inference"):
            self.c.teacher.prepare_for_lp_inference()
            topk = self.c.teacher.get_topk_logits(train_data, k=cfg.distillation.topk_logits_k)
            self.c.teacher.offload_after_refit()
        train_data["teacher_topk_logits"] = topk["topk_logits"]
        train_data["teacher_topk_indices"] = topk["topk_indices"]

        # 3. train the student towards them
        phase(step, "training")
        with timer.time("policy_training"):
            run.policy.prepare_for_training()
            train_results = run.policy.train(train_data, self.c.loss_fn)
            run.policy.finish_training()
        metrics = _train_metrics(train_results, train_data, rollouts.rewards, rollouts.rollout_metrics)
        return StepResult(
            metrics,
            valid_samples=int(train_data["sample_mask"].sum()),
            samples=sample_rows(rollouts.batch, rollouts.rewards, None, run.tokenizer, train_data),
            timing=rollouts.timing,
            kept=("loss", "reward"),
        )

    def save(self) -> Path | None:
        return save_checkpoint(self.c)

    def log_step(self, step: int, result: StepResult, timing: dict[str, float]) -> None:
        metrics = result.metrics
        self.logger.log_metrics(step_performance(metrics, timing), step, prefix="performance")
        self.logger.log_metrics(timing, step, prefix="timing/train")
        console.print(
            f"step {step}: loss {metrics['loss']:.4f}, forward KL {metrics['kl_forward']:.4f}, "
            f"reverse KL {metrics['kl_reverse']:.4f}, reward {metrics['reward']:.3f}"
        )


class Distillation(RolloutAlgorithm):
    name = "distillation"
    config_class = DistillationMasterConfig

    def setup(self, config: DistillationMasterConfig) -> DistillationComponents:
        return setup(config)

    def train(self, run: DistillationComponents) -> None:
        distillation_train(run)

    def frozen_models(self, config: DistillationMasterConfig) -> dict[str, Any]:
        return {"teacher": config.teacher}


ALGORITHM = Distillation()


def save_checkpoint(c: DistillationComponents) -> Path | None:
    """The student's checkpoint (``step_N``), with this run's config as its ``config.yaml``."""
    run = c.run
    return save_run_checkpoint(run.checkpointer, run.policy, run.dataloader, run.state, c.config)


def _train_metrics(
    train_results: dict[str, Any],
    train_data: Any,
    rewards: torch.Tensor,
    rollout_metrics: dict[str, float],
) -> dict[str, float]:
    """NeMo-RL's ``train/*`` distillation metrics (``loss``, ``grad_norm``, ``lr``, ``mean_prompt_length``,
    ``total_num_tokens``, rollout metrics) plus both KL directions and the student's environment reward."""
    metrics = reduce_train_results(train_results, _SHARE_METRICS, ("num_valid_samples",))
    mask = train_data["token_mask"]
    prompt_lengths = train_data["input_lengths"] - mask.sum(dim=1)
    metrics.update(
        reward=rewards.mean().item(),
        mean_prompt_length=prompt_lengths.float().mean().item(),
        total_num_tokens=float(train_data["input_lengths"].sum()),
        generated_tokens=float(mask.sum()),
        **{f"rollout/{k}": v for k, v in rollout_metrics.items()},
    )
    return metrics
