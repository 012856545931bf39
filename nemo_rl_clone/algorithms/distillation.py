"""On-policy distillation: generate → teacher top-k → train the student → sync weights → validate → checkpoint → log.

The student (``policy``) samples responses with vLLM exactly as GRPO's policy does; a frozen teacher (``teacher``,
a second `Policy` sharing the training cluster's bundles) returns its top-k logits at every position of those
samples, and the student is trained to match that distribution (`DistillationLossFn`: forward, reverse or mixed KL).
Everything but the teacher and the loss is GRPO's (`rl.setup.setup` builds the run from
`DistillationMasterConfig.rollout_view`; rollouts, validation, refit, checkpoints and logging are GRPO's functions),
so the two algorithms sample, validate and resume the same way. Environment rewards are computed and logged
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

from nemo_rl_clone.algorithms.grpo import log_validation
from nemo_rl_clone.algorithms.logits_sampling_utils import TrainingSamplingParams
from nemo_rl_clone.algorithms.loss.distillation import DistillationLossFn
from nemo_rl_clone.algorithms.rl.batches import build_train_batch, sample_rows
from nemo_rl_clone.algorithms.rl.distillation_config import DistillationConfig, DistillationMasterConfig
from nemo_rl_clone.algorithms.rl.rollouts import generate_step_rollouts, refit
from nemo_rl_clone.algorithms.rl.setup import GRPOComponents
from nemo_rl_clone.algorithms.rl.setup import setup as setup_student_run
from nemo_rl_clone.algorithms.run.state import save_run_checkpoint
from nemo_rl_clone.algorithms.run.stop import stop_on_signals
from nemo_rl_clone.algorithms.utils import reduce_train_results
from nemo_rl_clone.models.huggingface import load_tokenizer, resolve_model_path
from nemo_rl_clone.models.policy.lm_policy import Policy
from nemo_rl_clone.utils.checkpoint import SaveDeadline, should_save
from nemo_rl_clone.utils.config_validation import as_config
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.progress import StepProgress, advance, console, phase
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
    run: GRPOComponents  # the student's run: policy, vLLM engines, data, environments, logger, checkpoints, state
    teacher: Policy
    loss_fn: DistillationLossFn

    def shutdown(self) -> None:
        self.teacher.shutdown()
        self.run.shutdown()


def setup(config: DistillationMasterConfig | Mapping[str, Any]) -> DistillationComponents:
    """Build a distillation run from a config (validated here when given as NeMo-RL's plain dict); resumes the
    student from ``checkpointing.checkpoint_dir`` if it holds a checkpoint (the teacher always loads
    ``teacher.model_name``)."""
    config = as_config(config, DistillationMasterConfig)
    check_vocab_match(config)  # before Ray starts: a mismatch is one line, not a failed run
    run = setup_student_run(config.rollout_view(), extra_worker_groups=1, run_config=config)
    try:
        threads = {} if torch.cuda.is_available() else {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        teacher = Policy(
            run.clusters[0],
            config.teacher,
            run.tokenizer,
            name_prefix="teacher",
            init_optimizer=False,
            init_reference_model=False,
            env_vars=threads,
        )
    except BaseException:
        run.shutdown()
        raise
    loss_fn = DistillationLossFn(config.loss_fn, TrainingSamplingParams.from_generation(config.policy.generation))
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
    save deadline."""
    run, cfg = c.run, c.config
    with (
        StepProgress("Distillation", cfg.distillation.max_num_steps, start_step=run.state.step),
        stop_on_signals(
            run.checkpointer,
            run.state,
            run.dataloader,
            lambda: save_checkpoint(c),
            cfg.checkpointing.sigterm_grace_period_s,
        ),
    ):
        _run_steps(c)


def _run_steps(c: DistillationComponents) -> None:
    run, cfg, state, timer = c.run, c.config, c.run.state, Timer()
    steps = cfg.distillation
    deadline = SaveDeadline(cfg.checkpointing)
    batches = iter(run.dataloader)
    if state.step > 0:  # a resumed student differs from the model the engines loaded
        refit(run, timer)
    if steps.val_at_start and state.step == 0 and steps.val_period > 0:
        log_validation(run, 0)
    while state.step < steps.max_num_steps and run.dataloader.completed_epochs < steps.max_num_epochs:
        timer.reset()
        step = state.begin_step()
        with timer.time("total_step_time"):
            # 1. the student samples num_prompts_per_step x num_generations_per_prompt responses; rewards are logged
            phase(step, "generation")
            rollouts = generate_step_rollouts(run, step, batches, weight_version=step - 1)
            no_advantages = torch.zeros(rollouts.batch.size)
            train_data = build_train_batch(rollouts.batch, no_advantages, run.tokenizer, cfg.rollout_view())
            del train_data["advantages"], train_data["generation_logprobs"]

            # 2. the teacher's top-k logits at every position of those samples
            phase(step, "teacher top-k")
            with timer.time("teacher_logprob_inference"):
                c.teacher.prepare_for_lp_inference()
                topk = c.teacher.get_topk_logits(train_data, k=steps.topk_logits_k)
                c.teacher.offload_after_refit()
            train_data["teacher_topk_logits"] = topk["topk_logits"]
            train_data["teacher_topk_indices"] = topk["topk_indices"]

            # 3. train the student towards them
            phase(step, "training")
            with timer.time("policy_training"):
                run.policy.prepare_for_training()
                train_results = run.policy.train(train_data, c.loss_fn)
                run.policy.finish_training()
            state.step = step
            state.total_valid_samples += int(train_data["sample_mask"].sum())

            # 4. sync weights: the engines sample the next step and the validation with the weights just trained
            deadline.mark_step()
            stop_for_deadline = deadline.reached()
            is_last = (
                step >= steps.max_num_steps
                or run.dataloader.completed_epochs >= steps.max_num_epochs
                or stop_for_deadline
            )
            validating = (steps.val_period > 0 and step % steps.val_period == 0) or (steps.val_at_end and is_last)
            if validating or not is_last:
                phase(step, "weight sync")
                refit(run, timer)

            # 5. validation
            if validating:
                log_validation(run, step)

            # 6. checkpoint
            metrics = _train_metrics(train_results, train_data, rollouts.rewards, rollouts.rollout_metrics)
            state.train_metrics = {"loss": metrics["loss"], "reward": metrics["reward"]}
            # logged before the save: a run killed right after it resumes after this step (docs/grpo.md)
            run.logger.log_metrics(metrics, step, prefix="train")
            if should_save(step, cfg.checkpointing, is_last):
                phase(step, "checkpoint")
                with timer.time("checkpointing"):
                    save_checkpoint(c)

        # 7. log
        timing = {**rollouts.timing, **timer.get_timing_metrics("sum")}
        run.logger.log_metrics(_performance(metrics, timing), step, prefix="performance")
        run.logger.log_metrics(timing, step, prefix="timing/train")
        run.logger.log_samples_jsonl(
            sample_rows(rollouts.batch, rollouts.rewards, None, run.tokenizer, train_data), step
        )
        console.print(
            f"step {step}: loss {metrics['loss']:.4f}, forward KL {metrics['kl_forward']:.4f}, "
            f"reverse KL {metrics['kl_reverse']:.4f}, reward {metrics['reward']:.3f}"
        )
        advance(step)
        if stop_for_deadline:
            console.print(f"[yellow]checkpointing.checkpoint_must_save_by reached: saved and stopping at step {step}")
            break
    console.print(f"Done after step {state.step}. Logs: {run.log_dir}  Checkpoints: {cfg.checkpointing.checkpoint_dir}")


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


def _performance(metrics: dict[str, float], timing: dict[str, float]) -> dict[str, float]:
    return {
        "tokens_per_sec": metrics["total_num_tokens"] / max(timing["total_step_time"], 1e-9),
        "generation_tokens_per_sec": metrics["generated_tokens"] / max(timing["generation"], 1e-9),
        "policy_training_tokens_per_sec": metrics["total_num_tokens"] / max(timing["policy_training"], 1e-9),
    }
