"""Replay of a repro bundle (`rollout.repro`): one GRPO step's training call recomputed on CPU, in one process.

The policy worker the run trained with (`DTensorPolicyWorker`, world size 1) loads the weights the step started
from, recomputes the trainer logprobs of the step's batch the way `Policy.get_logprobs` does and runs the step's
training call the way `Policy.train` does (`TrainPlan`: the same rows left out, the same microbatches), with the
run's policy and loss config. What it compares, and with what tolerance: docs/debugging.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from nemo_rl_clone.rollout import repro
from nemo_rl_clone.utils.errors import UserInputError

# |recomputed - logged| <= TOLERANCE * max(1, |logged|): absolute below 1, relative above (fp32, same machine).
TOLERANCE = 1e-5
# The batch's per-sample inputs a non-finite loss can come from, in the order they are blamed.
_INPUTS = (
    "advantages",
    "generation_logprobs",
    "prev_logprobs",
    "reference_policy_logprobs",
    "token_mask",
    "sample_mask",
    "rewards",
)


class ReplayError(UserInputError):
    """A bundle that cannot be replayed: one line naming the file or setting at fault."""


@dataclass
class Bundle:
    path: Path
    step: int
    reasons: list[str]
    start: dict[str, Any]
    config: dict[str, Any]
    batch: dict[str, torch.Tensor]
    logged: dict[str, Any]


def load_bundle(path: str | Path) -> Bundle:
    """Read ``repro/step_N``; `ReplayError` on anything missing or unreadable."""
    path = Path(path)
    if not path.is_dir():
        raise ReplayError(f"{path}: no such folder (expected a repro bundle such as <log_dir>/repro/step_N)")
    missing = [
        name
        for name in (repro.BUNDLE_FILE, repro.CONFIG_FILE, repro.BATCH_FILE, repro.METRICS_FILE)
        if not (path / name).is_file()
    ]
    if missing:
        raise ReplayError(f"{path} is not a repro bundle: {', '.join(missing)} missing")
    try:
        info = json.loads((path / repro.BUNDLE_FILE).read_text())
        logged = json.loads((path / repro.METRICS_FILE).read_text())
        config = yaml.safe_load((path / repro.CONFIG_FILE).read_text())
        step, start = int(info["step"]), dict(info["start"])
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as err:
        raise ReplayError(f"{path}: unreadable bundle metadata ({type(err).__name__}: {err})") from None
    try:
        batch = torch.load(path / repro.BATCH_FILE, weights_only=True)
    except Exception as err:  # torch raises many kinds on a damaged file
        # torch's messages run over many lines and suggest weights_only=False, which is not the fix here
        raise ReplayError(f"{path / repro.BATCH_FILE}: not a readable torch.save file ({type(err).__name__})") from None
    needed = {"input_ids", "input_lengths", "token_mask", "sample_mask", "advantages", "generation_logprobs"}
    if not isinstance(batch, dict) or not needed <= set(batch):
        have = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ReplayError(f"{path / repro.BATCH_FILE}: needs {sorted(needed)}, has {have}")
    if not isinstance(config, dict) or not isinstance(config.get("policy"), dict):
        raise ReplayError(f"{path / repro.CONFIG_FILE}: no policy section")
    return Bundle(path, step, list(info.get("reasons", [])), start, config, batch, logged)


def nonfinite_samples(
    batch: Mapping[str, torch.Tensor], group_size: int, recomputed: torch.Tensor | None = None
) -> list[str]:
    """One line per (row, input) holding a NaN or inf: which sample of which prompt group, which input, and how
    many of the row's loss tokens it touches. ``recomputed``: the replay's trainer logprobs, blamed last."""
    inputs = {key: batch[key] for key in _INPUTS if key in batch}
    if recomputed is not None:
        inputs["recomputed trainer logprobs"] = recomputed
    token_mask = batch["token_mask"] > 0
    lines = []
    for row in range(batch["input_ids"].shape[0]):
        for key, tensor in inputs.items():
            values = tensor[row].float()
            bad = ~torch.isfinite(values)
            if not bad.any():
                continue
            example = values[bad].flatten()[0].item()
            where = ""
            if values.dim() == 1 and values.shape == token_mask[row].shape:
                on_loss = int((bad & token_mask[row]).sum())
                where = f" at {int(bad.sum())} positions, {on_loss} of its {int(token_mask[row].sum())} loss tokens"
            lines.append(
                f"row {row} (prompt group {row // max(group_size, 1)}, sample {row % max(group_size, 1)}): "
                f"{key} is {example}{where}"
            )
    return lines


def close(logged: float, recomputed: float) -> bool:
    """Within `TOLERANCE`; two non-finite values of the same kind (both NaN, or the same inf) also agree."""
    if not (math.isfinite(logged) and math.isfinite(recomputed)):
        return (math.isnan(logged) and math.isnan(recomputed)) or logged == recomputed
    return abs(logged - recomputed) <= TOLERANCE * max(1.0, abs(logged))


@dataclass
class Replayed:
    logprobs: torch.Tensor  # [B, S] the trainer's logprobs of the batch under the start weights
    metrics: dict[str, float]  # `training_metrics` of the replayed training call
    per_global_batch: dict[str, list[float]]
    optimizer_restored: bool


def policy_config(bundle: Bundle) -> Any:
    """The run's ``policy`` section re-laid out for one process (no tensor/context/expert parallelism, nothing
    offloaded)."""
    from nemo_rl_clone.models.policy.backends import backend_key, backend_spec
    from nemo_rl_clone.models.policy.config import PolicyConfig
    from nemo_rl_clone.utils.config_validation import ConfigError, validate_config

    section = dict(bundle.config["policy"])
    backend = backend_spec(section)
    if not backend.step_replay:
        raise ReplayError(
            f"{bundle.path}: the run used the {backend.title} backend (policy.{backend_key(section)}); the replay "
            "supports the DTensor backend only"
        )
    dtensor = dict(section.get("dtensor_cfg") or {})
    dtensor.update(tensor_parallel_size=1, context_parallel_size=1, expert_parallel_size=1, cpu_offload=False)
    try:
        return validate_config({**section, "dtensor_cfg": dtensor}, PolicyConfig)
    except ConfigError as err:
        raise ReplayError(f"{bundle.path / repro.CONFIG_FILE}: policy.{err.problems[0]}") from None


def replay(bundle: Bundle, make_loss: Callable[[Mapping[str, Any], Any], Any]) -> Replayed:
    """Recompute the step's trainer logprobs and training call from its start weights (see the module doc).
    ``make_loss(loss_fn section, sampling params)`` builds the run's loss (the algorithm that wrote the bundle knows
    which); a `ConfigError` it raises names the bad key."""
    from nemo_rl_clone.contract.sampling import TrainingSamplingParams
    from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
    from nemo_rl_clone.models.huggingface import check_model_available
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker
    from nemo_rl_clone.models.policy.lm_policy import TrainPlan, merge_shards, shard_batch
    from nemo_rl_clone.models.policy.workers import worker_setup
    from nemo_rl_clone.rollout.batches import training_metrics
    from nemo_rl_clone.utils.config_validation import ConfigError

    cfg = policy_config(bundle)
    try:
        loss_fn = make_loss(bundle.config.get("loss_fn") or {}, TrainingSamplingParams.from_generation(cfg.generation))
    except ConfigError as err:
        raise ReplayError(f"{bundle.path / repro.CONFIG_FILE}: loss_fn.{err.problems[0]}") from None
    weights = optimizer = None
    if bundle.start.get("kind") == "checkpoint":
        policy_dir = start_checkpoint(bundle) / "policy"
        if not (policy_dir / "weights").is_dir():
            why = (
                "the bundle's linked checkpoint is incomplete"
                if bundle.start.get("linked", True)
                else ("a monitor's bundle names its checkpoint without keeping it, and keep_top_k has pruned it")
            )
            raise ReplayError(f"{policy_dir / 'weights'}: missing ({why})")
        weights = str(policy_dir / "weights")
        optimizer = str(policy_dir / "optimizer") if (policy_dir / "optimizer").is_dir() else None
    try:
        model_path = check_model_available(cfg.model_name)
    except OSError as err:
        raise ReplayError(f"policy.model_name: {str(err).splitlines()[0]}") from None
    worker_setup.set_single_process_env()
    worker = DTensorPolicyWorker(
        cfg,
        cfg.tokenizer.load(cfg.model_name),
        model_path,
        weights_path=weights,
        optimizer_path=optimizer,
        init_reference_model=False,  # the batch holds the run's reference logprobs
    )
    try:
        data = BatchedDataDict({k: v for k, v in bundle.batch.items() if k != "rewards"})
        shards, order = shard_batch(cfg, 1, data, "logprob", allow_uneven_shards=True)
        logprobs = merge_shards([worker.get_logprobs(shard) for shard in shards], order)["logprobs"]
        gbs, mbs = cfg.train_global_batch_size, cfg.train_micro_batch_size
        plan = TrainPlan.make(cfg, 1, data, loss_fn, gbs, mbs, router_aux_loss=worker.has_router_aux_loss())
        result = plan.result([worker.train(plan.shards[0], **plan.kwargs)])
    finally:
        worker.shutdown()
    per_global_batch = {
        key: [float(v) for v in torch.as_tensor(result[key]).flatten()] for key in ("loss", "grad_norm")
    }
    return Replayed(logprobs, training_metrics(result), per_global_batch, optimizer is not None)


def comparison_rows(bundle: Bundle, replayed: Replayed) -> tuple[list[tuple[str, str, str, str, bool]], list[str]]:
    """(quantity, logged, recomputed, |diff|, agrees) rows, and notes on what is not compared."""
    rows: list[tuple[str, str, str, str, bool]] = []
    notes: list[str] = []
    mask = bundle.batch["token_mask"] > 0
    mask[:, 0] = False  # position 0 has no logprob
    reference_key = "prev_logprobs" if "prev_logprobs" in bundle.batch else None
    if reference_key is not None and mask.any():
        gap = (replayed.logprobs.float() - bundle.batch[reference_key].float())[mask].abs()
        worst = float(gap.max()) if torch.isfinite(gap).all() else float("nan")
        label = f"trainer logprobs, max over {int(mask.sum())} loss tokens"
        rows.append((label, "(prev_logprobs)", "", f"{worst:.3g}", close(0.0, worst)))
    elif mask.any():
        gap = (replayed.logprobs.float() - bundle.batch["generation_logprobs"].float())[mask].abs()
        notes.append(
            f"the step computed no trainer logprobs (loss_fn.force_on_policy_ratio): recomputed vs the engine's, max "
            f"|diff| {float(gap.max()):.3g} over {int(mask.sum())} loss tokens (not judged: engine and trainer differ)"
        )
    logged_train: dict[str, float] = bundle.logged.get("train", {})
    logged_batches: dict[str, list[float]] = bundle.logged.get("per_global_batch", {})
    num_batches = len(logged_batches.get("loss", [])) or 1
    if num_batches == 1 or replayed.optimizer_restored:
        others = sorted(k for k in replayed.metrics if k in logged_train and k not in ("loss", "grad_norm", "lr"))
        keys = ["loss", "grad_norm", *others]
        for key in keys:
            if key in logged_train and key in replayed.metrics:
                rows.append(_row(f"train/{key}", logged_train[key], replayed.metrics[key]))
        if num_batches > 1:
            for key in ("loss", "grad_norm"):
                for i, (old, new) in enumerate(
                    zip(logged_batches.get(key, []), replayed.per_global_batch[key], strict=False)
                ):
                    rows.append(_row(f"{key} of global batch {i + 1}", old, new))
    else:
        for key in ("loss", "grad_norm"):
            if logged_batches.get(key):
                rows.append(_row(f"{key} of global batch 1", logged_batches[key][0], replayed.per_global_batch[key][0]))
        notes.append(
            f"the start checkpoint holds no optimizer state: of the step's {num_batches} optimizer steps only the "
            "first is reproduced (the later ones start from weights the first update moved)"
        )
    return rows, notes


def _row(name: str, logged: float, recomputed: float) -> tuple[str, str, str, str, bool]:
    diff = abs(logged - recomputed) if math.isfinite(logged) and math.isfinite(recomputed) else float("nan")
    return (name, f"{logged:.8g}", f"{recomputed:.8g}", f"{diff:.3g}", close(logged, recomputed))


def format_table(rows: list[tuple[str, str, str, str, bool]]) -> list[str]:
    header = ("quantity", "logged", "recomputed", "|diff|", "")
    cells = [header] + [(n, a, b, d, "ok" if ok else "MISMATCH") for n, a, b, d, ok in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in cells]


def start_checkpoint(bundle: Bundle) -> Path:
    """The checkpoint folder the bundle's step started from: its linked copy, or the run's own (not linked)."""
    if bundle.start.get("linked", True):  # bundles before "linked" existed were always linked
        return bundle.path / repro.CHECKPOINT_DIR
    return Path(str(bundle.start["checkpoint"]))


def describe_start(bundle: Bundle) -> str:
    kind = bundle.start.get("kind")
    if kind == "initial_model":
        return f"the initial weights (policy.model_name {bundle.config['policy'].get('model_name')})"
    if kind == "checkpoint":
        optimizer = (start_checkpoint(bundle) / "policy" / "optimizer").is_dir()
        name = Path(str(bundle.start.get("checkpoint", "checkpoint"))).name
        return f"checkpoint {name} ({'with' if optimizer else 'without'} optimizer state)"
    return "weights that were not saved"
