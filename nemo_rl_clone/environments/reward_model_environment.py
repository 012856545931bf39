"""`RewardModelEnvironment`: a Bradley-Terry reward model scores each finished episode; the reward is its score.

The model is a checkpoint of ``examples/run_rm.py`` (``checkpoint_path``) or any Hugging Face
``*ForSequenceClassification`` reward model (``model_name``). It runs in this environment's own Ray actor (on a GPU
with ``resources.gpus_per_node: 1``), batched by ``batch_size``, through the same last-token scorer the reward-model
trainer uses (`models.policy.workers.reward_model`): the one environment that imports model code, since its scorer is a model.

What is scored: the conversation's text exactly as the policy saw it (its messages' ``content`` are the chat
template's rendering, see `data.llm_message_utils`), with the final assistant turn closed the way the reward model's
chat template closes one (e.g. ``<|im_end|>\\n``): for a reward model trained on the policy's chat format, the text a
reward-model training pair of the same conversation would be. It is encoded with the reward model's tokenizer and
its last ``max_model_len`` tokens are scored (longer conversations are counted in ``truncated``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
import yaml

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.environments.config import RewardModelEnvConfig, check_env_config
from nemo_rl_clone.environments.interfaces import (
    EnvironmentInterface,
    EnvironmentReturn,
    check_step_batch,
    last_assistant_text,
)
from nemo_rl_clone.utils.checkpoint import CONFIG_FILE, find_checkpoint_step
from nemo_rl_clone.utils.errors import UserInputError

KEY = "env.reward_model"


class RewardModelError(UserInputError):
    """``env.reward_model`` names no usable reward model (a missing checkpoint, a policy checkpoint, no GPU, ...)."""


@dataclass(frozen=True)
class RewardModelSource:
    """Where the scorer's pieces come from.

    model_path: the architecture (and, without ``weights_dir``, the weights) for ``AutoModelForSequenceClassification``.
    tokenizer_path: the tokenizer.
    weights_dir: a ``run_rm.py`` checkpoint's DCP weights loaded over ``model_path``'s, or None.
    """

    model_path: str
    tokenizer_path: str
    weights_dir: Path | None


def resolve_reward_model(cfg: RewardModelEnvConfig) -> RewardModelSource:
    """Find the reward model ``cfg`` names, reading only small files (config.yaml, config.json)."""
    from nemo_rl_clone.models.huggingface import check_model_available, resolve_model_path
    from nemo_rl_clone.models.policy.backends import policy_backend

    if cfg.checkpoint_path is None:
        assert cfg.model_name is not None  # validation requires one of the two
        try:  # a hub id is looked up with a bounded wait
            model_path = check_model_available(cfg.model_name)
        except OSError as error:
            raise RewardModelError(f"{KEY}.model_name: {error}") from None
        _require_score_head(model_path)
        tokenizer = cfg.tokenizer.name or cfg.model_name
        return RewardModelSource(model_path, tokenizer, None)

    step_dir = _checkpoint_step(Path(cfg.checkpoint_path).expanduser())
    policy = _checkpoint_policy(step_dir)
    trained_from = policy.get("model_name")
    if cfg.model_name is not None and cfg.model_name != trained_from:
        raise RewardModelError(
            f"{KEY}.model_name: {cfg.model_name!r}, but the checkpoint {step_dir} was trained from {trained_from!r}; "
            "set it to that model or to null"
        )
    saved_tokenizer = step_dir / "policy" / "tokenizer"
    tokenizer = cfg.tokenizer.name or (str(saved_tokenizer) if saved_tokenizer.is_dir() else str(trained_from))
    hf_export = step_dir / "policy" / "hf"
    if (hf_export / "config.json").is_file():  # a consolidated export: load it as is
        return RewardModelSource(str(hf_export), tokenizer, None)
    if policy_backend(policy) != "dtensor":
        raise RewardModelError(
            f"{KEY}.checkpoint_path: {step_dir} was trained on the {policy_backend(policy)} backend and holds no "
            "consolidated Hugging Face export (policy/hf); convert it with examples/converters/convert_megatron_to_hf.py "
            "and name the result in model_name"
        )
    return RewardModelSource(resolve_model_path(str(trained_from)), tokenizer, step_dir / "policy" / "weights")


def _checkpoint_step(path: Path) -> Path:
    if path.name == "weights" and path.parent.name == "policy":  # NeMo-RL names the weights folder itself
        path = path.parent
    step_dir = find_checkpoint_step(path) if path.is_dir() else None
    if step_dir is None:
        raise RewardModelError(
            f"{KEY}.checkpoint_path: {path} is not a checkpoint (expected a run_rm.py checkpoint_dir, or a step_N "
            "folder with policy/weights)"
        )
    return step_dir


def _checkpoint_policy(step_dir: Path) -> dict[str, Any]:
    config_path = step_dir / CONFIG_FILE
    loaded = yaml.safe_load(config_path.read_text()) if config_path.is_file() else None
    policy = loaded.get("policy") if isinstance(loaded, dict) else None
    if not isinstance(policy, dict) or not isinstance(policy.get("model_name"), str):
        raise RewardModelError(f"{KEY}.checkpoint_path: {config_path} is missing or names no policy.model_name")
    if not (policy.get("reward_model_cfg") or {}).get("enabled"):
        raise RewardModelError(
            f"{KEY}.checkpoint_path: {step_dir} is a policy (causal LM) checkpoint, not a reward model "
            "(policy.reward_model_cfg.enabled is not true in its config.yaml); train one with examples/run_rm.py"
        )
    return policy


def _require_score_head(model_path: str) -> None:
    """A local folder must hold a sequence-classification model: a causal LM would get a random score head."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return  # a hub id: from_pretrained reports what it finds
    architectures = json.loads(config_file.read_text()).get("architectures") or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise RewardModelError(
            f"{KEY}.model_name: {model_path} holds {', '.join(architectures) or 'no architecture'}, which has no "
            "trained score head; name a *ForSequenceClassification reward model, or set checkpoint_path to a "
            "run_rm.py checkpoint"
        )


# NeMo-RL's shape of the ``env.reward_model`` section as a dict; it is validated as `RewardModelEnvConfig`, which
# names each key it refuses: ``logprob_batch_size`` and ``generation`` are not keys here (the scorer batches by
# ``batch_size`` and generates nothing). The call form keeps `NotRequired` readable under postponed annotations.
RewardModelEnvironmentConfig = TypedDict(  # noqa: UP013 (see above)
    "RewardModelEnvironmentConfig",
    {
        "enabled": bool,
        "model_name": str,
        "precision": str,
        "batch_size": int,
        "checkpoint_path": str | None,
        "logprob_batch_size": NotRequired[int],
        "resources": dict[str, Any],
        "dtensor_cfg": dict[str, Any] | None,
        "dynamic_batching": NotRequired[dict[str, Any]],
        "sequence_packing": NotRequired[dict[str, Any]],
        "max_grad_norm": NotRequired[float | None],
        "generation": NotRequired[dict[str, Any] | None],
        "tokenizer": NotRequired[dict[str, Any]],
        "max_model_len": NotRequired[int],
        "reward_model_cfg": NotRequired[dict[str, Any]],
    },
)


class RewardModelEnvironment(EnvironmentInterface):
    """``env.reward_model``; every episode ends after one turn with the reward model's score as its reward."""

    @staticmethod
    def actor_options(cfg: RewardModelEnvConfig) -> dict[str, Any]:
        """Ray options of the actor (`create_env` calls this in the driver, so a bad model fails there, at once)."""
        import ray

        resolve_reward_model(cfg)
        gpus = cfg.resources.gpus_per_node
        available = ray.cluster_resources().get("GPU", 0.0)
        if gpus > available:
            raise RewardModelError(
                f"{KEY}.resources.gpus_per_node: {gpus} GPU asked for, the Ray cluster has {available:g}; set it to "
                "0 to score on the CPU"
            )
        return {"num_gpus": gpus} if gpus else {}

    def __init__(self, config: RewardModelEnvConfig):
        from nemo_rl_clone.data.llm_message_utils import assistant_turn_closing
        from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
        from nemo_rl_clone.models.huggingface import load_tokenizer
        from nemo_rl_clone.models.policy.workers.reward_model import LastTokenScorer, load_reward_model

        cfg = config
        check_env_config("reward_model", cfg)
        self.cfg = cfg
        source = resolve_reward_model(cfg)
        self.device = torch.device("cuda" if cfg.resources.gpus_per_node else "cpu")
        if self.device.type == "cpu":  # the actor takes no logical CPU; it scores while the workers wait for it
            torch.set_num_threads(os.cpu_count() or 1)
        self.tokenizer = load_tokenizer(source.tokenizer_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = load_reward_model(source.model_path, self.tokenizer.pad_token_id)
        if source.weights_dir is not None:
            model.load_state_dict(load_dcp_model_state_dict(source.weights_dir), strict=True)
        dtype = torch.bfloat16 if cfg.precision == "bfloat16" else torch.float32
        module: torch.nn.Module = model  # nn.Module's `to` (transformers wraps its own)
        self.model = module.to(device=self.device, dtype=dtype).eval()
        self.scorer = LastTokenScorer(self.model)
        self._closing = {ended: assistant_turn_closing(self.tokenizer, ended) for ended in (True, False)}
        self._counts = {"scored": 0, "truncated": 0}
        self._score_seconds = 0.0

    def conversation_text(self, message_log: Sequence[Mapping[str, Any]], sample_index: int = 0) -> str:
        """The text scored for one conversation: its messages' contents, the last assistant turn closed."""
        last_assistant_text(message_log, sample_index)  # one clear error when there is nothing to score
        text = "".join(str(message["content"]) for message in message_log)
        eos = self.tokenizer.eos_token
        return text + self._closing[bool(eos) and text.endswith(eos)]

    def preprocess_data(self, message_logs: list[list[dict[str, Any]]]) -> BatchedDataDict:
        """NeMo-RL's reward-model input of ``message_logs``: ``input_ids`` [B, S] right-padded with the pad token and
        ``input_lengths`` [B], the tokens `step` scores (each conversation's `conversation_text`, encoded without
        special tokens, its last ``max_model_len`` tokens kept)."""
        texts = [self.conversation_text(log, i) for i, log in enumerate(message_logs)]
        return self._right_padded(self._encode(texts)[0])

    def _encode(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Each text's token rows as scored, and how many were cut to ``max_model_len``."""
        encoded = [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]
        limit = self.cfg.max_model_len
        rows = [ids[-limit:] or [self.tokenizer.pad_token_id] for ids in encoded]
        return rows, sum(len(ids) > limit for ids in encoded)

    def _right_padded(self, rows: Sequence[list[int]]) -> BatchedDataDict:
        lengths = torch.tensor([len(ids) for ids in rows], dtype=torch.long)
        width = max((len(ids) for ids in rows), default=0)
        input_ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
        return BatchedDataDict(input_ids=input_ids, input_lengths=lengths)

    @torch.no_grad()
    def score_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """float32[B] scores of whole texts (each encoded without special tokens, its last ``max_model_len`` kept)."""
        start = time.perf_counter()
        rows, truncated = self._encode(texts)
        self._counts["truncated"] += truncated
        self._counts["scored"] += len(rows)
        scores = []
        for first in range(0, len(rows), self.cfg.batch_size):
            batch = self._right_padded(rows[first : first + self.cfg.batch_size])
            input_ids, lengths = batch["input_ids"].to(self.device), batch["input_lengths"].to(self.device)
            scores.append(self.scorer(input_ids, lengths)[:, 0].float().cpu())
        self._score_seconds += time.perf_counter() - start
        return torch.cat(scores) if scores else torch.zeros(0)

    def step(self, message_logs: list[list[dict[str, Any]]], env_infos: list[dict[str, Any]]) -> EnvironmentReturn:
        check_step_batch(message_logs, env_infos)
        texts = [self.conversation_text(log, i) for i, log in enumerate(message_logs)]
        rewards = self.score_texts(texts)
        n = len(texts)
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": f"Environment: reward {r:.4f}"} for r in rewards.tolist()],
            metadata=list(env_infos),
            next_stop_strings=[None] * n,
            rewards=rewards,
            terminateds=torch.ones(n, dtype=torch.bool),
            answers=[None] * n,
        )

    def global_post_process_and_metrics(self, batch: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, float]]:
        """Reads ``rewards`` [B] (the batch's total rewards): their mean, std, min and max; and over the
        conversations scored since the previous call: ``num_scored``, ``truncated`` (counts), ``score_seconds``."""
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32).flatten()
        metrics = {"num_samples": float(rewards.numel())}
        if rewards.numel():
            metrics.update(
                mean_reward=rewards.mean().item(),
                std_reward=rewards.std(unbiased=False).item(),
                min_reward=rewards.min().item(),
                max_reward=rewards.max().item(),
            )
        metrics.update(
            num_scored=float(self._counts["scored"]),
            truncated=float(self._counts["truncated"]),
            score_seconds=self._score_seconds,
        )
        self._counts = {"scored": 0, "truncated": 0}
        self._score_seconds = 0.0
        return batch, metrics
