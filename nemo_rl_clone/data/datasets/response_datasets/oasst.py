"""NeMo-RL's OpenAssistant form (``OpenAssistant/oasst1``, the message trees file): every path from a tree's root
prompt to a leaf reply is one conversation, after a fixed system prompt; single-exchange paths are dropped."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import datasets

from nemo_rl_clone.data.datasets import DataError
from nemo_rl_clone.data.datasets.common import DatasetLoadError
from nemo_rl_clone.data.datasets.raw_dataset import RawDataset

SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.\n\n"
)
_ROLES = {"prompter": "user", "assistant": "assistant"}
TREES_FILE = "2023-04-12_oasst_all.trees.jsonl.gz"


def parse_conversations(tree_obj: dict[str, Any], first: bool = False) -> list[list[dict[str, str]]]:
    """Every conversation from node ``tree_obj`` (a tree with ``prompt``, or a message with ``text`` and ``role``)
    down to each leaf; ``first`` starts each with the system prompt. A node that is neither gives ``[[]]``."""
    turns = [{"content": SYSTEM_PROMPT, "role": "system"}] if first else []
    node = tree_obj.get("prompt", tree_obj)
    if "prompt" not in tree_obj and not ("text" in tree_obj and "role" in tree_obj):
        return [[]]
    if node["role"] not in _ROLES:
        raise DataError(f"oasst: unknown role {node['role']!r}")
    turns.append({"content": node["text"], "role": _ROLES[node["role"]]})
    below = [thread for reply in node["replies"] for thread in parse_conversations(reply)]
    return [turns + thread for thread in below] if below else [turns]


def get_data_records(objs: list[dict[str, Any]], task_name: str = "oasst") -> list[dict[str, Any]]:
    """The rows (``messages``, ``task_name``) of the message trees ``objs``: one per conversation longer than the
    system prompt and one message."""
    return [
        {"messages": conversation, "task_name": task_name}
        for obj in objs
        for conversation in parse_conversations(obj, first=True)
        if len(conversation) > 2
    ]


class OasstDataset(RawDataset):
    """The trees file from the hub (``data_path``: a local copy, ``.jsonl`` or ``.jsonl.gz``),
    ``split_validation_size`` of the conversations held out with ``seed``."""

    def __init__(
        self, split_validation_size: float = 0.05, seed: int = 42, data_path: str | Path | None = None, **kwargs: Any
    ) -> None:
        self.task_name = "oasst"
        path = Path(data_path) if data_path is not None else _download_trees()
        if not path.is_file():
            raise DataError(f"data.data_path: file {str(path)!r} does not exist")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            trees = [json.loads(line) for line in lines if line.strip()]
        self.dataset = datasets.Dataset.from_list(get_data_records(trees, task_name=self.task_name))
        self.val_dataset = None
        self.split_train_validation(split_validation_size, seed)


def _download_trees() -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download("OpenAssistant/oasst1", TREES_FILE, repo_type="dataset"))
    except (ConnectionError, OSError, ValueError) as err:
        raise DatasetLoadError(
            f"oasst: could not download {TREES_FILE} from OpenAssistant/oasst1: {type(err).__name__}: {err}; "
            "point data_path at a local copy"
        ) from err
