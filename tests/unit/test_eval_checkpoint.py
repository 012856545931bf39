"""`resolve_eval_model`: model names and checkpoint folders → an HF folder for the engines; the ``local`` dataset.

Checkpoints here are written in the policy worker's format (``dcp.save({"model": state_dict})`` under
``step_N/policy/weights``, tokenizer under ``policy/tokenizer``, ``config.yaml`` naming ``policy.model_name``);
tests/functional/test_eval.py evaluates one written by a real `Policy.save_checkpoint`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from nemo_rl_clone.data.datasets import load_dataset_by_name
from nemo_rl_clone.evals import checkpoint as eval_checkpoint
from nemo_rl_clone.evals.checkpoint import EvalModelError, resolve_eval_model
from nemo_rl_clone.models.hf_export import load_hf_state_dict
from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path
from nemo_rl_clone.utils.checkpoint import find_checkpoint_step


@pytest.fixture(scope="module")
def perturbed_state() -> dict[str, torch.Tensor]:
    """The tiny model's weights plus noise: a checkpoint that differs from the model it started from."""
    base = load_hf_state_dict(resolve_model_path(TINY_LLAMA))
    generator = torch.Generator().manual_seed(0)
    # The tied head must stay equal to the embedding (the export refuses a tied head that differs).
    noisy = {k: v + 0.01 * torch.randn(v.shape, generator=generator) for k, v in base.items() if k != "lm_head.weight"}
    noisy["lm_head.weight"] = noisy["model.embed_tokens.weight"]
    return noisy


def write_step(checkpoint_dir: Path, step: int, state: dict[str, torch.Tensor], reward_model: bool = False) -> Path:
    """A complete ``step_N`` as CheckpointManager + Policy.save_checkpoint lay it out (weights in DCP)."""
    import torch.distributed.checkpoint as dcp

    step_dir = checkpoint_dir / f"step_{step}"
    dcp.save({"model": dict(state)}, checkpoint_id=step_dir / "policy" / "weights", no_dist=True)
    load_tokenizer(TINY_LLAMA).save_pretrained(step_dir / "policy" / "tokenizer")
    policy = {"model_name": TINY_LLAMA, "tokenizer": {"name": None}, "reward_model_cfg": {"enabled": reward_model}}
    (step_dir / "config.yaml").write_text(yaml.safe_dump({"policy": policy}))
    (step_dir / "training_info.json").write_text(json.dumps({"step": step}))
    return step_dir


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_checkpoint_dir_converts_its_latest_step_once(tmp_path: Path, perturbed_state) -> None:
    base = load_hf_state_dict(resolve_model_path(TINY_LLAMA))
    write_step(tmp_path, 1, base)
    latest = write_step(tmp_path, 3, perturbed_state)
    (tmp_path / "step_7").mkdir()  # no training_info.json: an incomplete step is never picked

    model = resolve_eval_model(str(tmp_path))
    hf_dir = latest / "policy" / "hf"
    assert (model.model_path, model.step) == (str(hf_dir), 3)
    assert model.tokenizer_path == str(latest / "policy" / "tokenizer")
    assert f"DCP weights converted to {hf_dir}" in model.description
    converted = load_hf_state_dict(hf_dir)
    assert converted.keys() == perturbed_state.keys()
    assert all(torch.equal(converted[k], perturbed_state[k]) for k in converted)
    assert not torch.equal(converted["model.norm.weight"], base["model.norm.weight"])

    # The export is now the checkpoint's HF folder: later evaluations (of step_3 or step_3/policy) load it as is.
    written = (hf_dir / "model.safetensors").stat().st_mtime_ns
    for name in (latest, latest / "policy"):
        again = resolve_eval_model(str(name))
        assert again.model_path == str(hf_dir) and "Hugging Face export" in again.description
    assert (hf_dir / "model.safetensors").stat().st_mtime_ns == written
    assert find_checkpoint_step(tmp_path / "step_1") == tmp_path / "step_1"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_concurrent_evaluations_convert_once(tmp_path: Path, perturbed_state) -> None:
    from concurrent.futures import ThreadPoolExecutor

    step_dir = write_step(tmp_path, 1, perturbed_state)
    with ThreadPoolExecutor(3) as pool:
        models = list(pool.map(resolve_eval_model, [str(step_dir)] * 3))
    assert {m.model_path for m in models} == {str(step_dir / "policy" / "hf")}
    assert sum("converted" in m.description for m in models) == 1  # the others waited for that export
    assert sorted(p.name for p in (step_dir / "policy").iterdir()) == ["hf", "tokenizer", "weights"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_read_only_checkpoint_converts_into_a_temporary_folder(tmp_path: Path, perturbed_state, monkeypatch) -> None:
    step_dir = write_step(tmp_path, 2, perturbed_state)
    # As on read-only storage (file modes cannot show it: the tests may run as root, which ignores them).
    monkeypatch.setattr(eval_checkpoint, "is_writable", lambda folder: False)
    model = resolve_eval_model(str(step_dir))
    temporary = Path(model.model_path)
    assert not temporary.is_relative_to(step_dir) and not (step_dir / "policy" / "hf").exists()
    assert torch.equal(load_hf_state_dict(temporary)["model.norm.weight"], perturbed_state["model.norm.weight"])
    model.cleanup()
    assert not temporary.exists()


def test_plain_model_names_pass_through(tmp_path: Path) -> None:
    model = resolve_eval_model(TINY_LLAMA)
    assert (model.model_path, model.tokenizer_path, model.step) == (TINY_LLAMA, TINY_LLAMA, None)
    folder = resolve_model_path(TINY_LLAMA)
    assert resolve_eval_model(folder).model_path == folder
    with pytest.raises(EvalModelError, match=r"generation.model_name: model folder '/no/such/model' does not exist"):
        resolve_eval_model("/no/such/model")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_reward_models_are_refused(tmp_path: Path, perturbed_state) -> None:
    step_dir = write_step(tmp_path / "rm", 1, perturbed_state, reward_model=True)
    with pytest.raises(EvalModelError, match=r"step_1 is a reward-model checkpoint \(policy.reward_model_cfg.enabled"):
        resolve_eval_model(str(step_dir))

    folder = tmp_path / "rm_hf"
    folder.mkdir()
    config = json.loads((Path(resolve_model_path(TINY_LLAMA)) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    with pytest.raises(EvalModelError, match=r"holds a reward model \(LlamaForSequenceClassification\)"):
        resolve_eval_model(str(folder))


def test_incomplete_checkpoints_name_what_is_missing(tmp_path: Path) -> None:
    step_dir = tmp_path / "step_4"
    (step_dir / "policy" / "weights").mkdir(parents=True)
    with pytest.raises(EvalModelError, match=r"step_4: checkpoint has no config.yaml"):
        resolve_eval_model(str(step_dir))
    (step_dir / "config.yaml").write_text(yaml.safe_dump({"policy": {"model_name": TINY_LLAMA}}))
    with pytest.raises(EvalModelError, match=r"step_4: checkpoint has neither policy/hf nor DCP weights"):
        resolve_eval_model(str(step_dir))


# ---------------------------------------------------------------------------- the "local" dataset
def test_local_math_file_with_named_columns(tmp_path: Path) -> None:
    path = tmp_path / "problems.csv"
    path.write_text("question,solution,source\nWhat is 2+2?,4,a\nHalf of 1?,\\frac{1}{2},b\n")
    loaded = load_dataset_by_name("local", data_path=str(path), problem_key="question", solution_key="solution")
    assert loaded.train is None
    assert list(loaded.validation) == [
        {"problem": "What is 2+2?", "expected_answer": "4", "task_name": "math"},
        {"problem": "Half of 1?", "expected_answer": "\\frac{1}{2}", "task_name": "math"},
    ]
    with pytest.raises(ValueError, match=r"missing column\(s\) \['problem', 'answer'\]; the file has \['question'"):
        load_dataset_by_name("local", data_path=str(path))

    empty = tmp_path / "empty_answer.jsonl"
    empty.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": ""}\n')
    with pytest.raises(ValueError, match=r"row 1: field 'answer' is missing or empty"):
        load_dataset_by_name("local", data_path=str(empty))
