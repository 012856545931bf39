"""NeMo-RL's checkpoint helpers at its paths: ``utils.native_checkpoint`` (save / load / convert a DCP checkpoint)
and ``models.megatron.community_import.export_model_from_megatron``'s checks, called the way NeMo-RL's docs and
converters call them (paths as ``str`` or ``pathlib.Path``). The converters on checkpoints of real training steps:
tests/functional/test_nemo_rl_converters.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict
from nemo_rl_clone.models.megatron.community_import import export_model_from_megatron
from nemo_rl_clone.utils.errors import UserInputError
from nemo_rl_clone.utils.native_checkpoint import convert_dcp_to_hf, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _linear(
    seed: int, steps: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.5, total_iters=4)
    for _ in range(steps):
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler


def test_save_and_load_round_trip_in_the_policy_layout(tmp_path: Path) -> None:
    model, optimizer, scheduler = _linear(0, steps=2)
    tokenizer_saved: list[str] = []

    class Tokenizer:
        def save_pretrained(self, path: str) -> None:
            tokenizer_saved.append(path)

    save_checkpoint(
        model, tmp_path / "weights", optimizer, scheduler, str(tmp_path / "optimizer"), Tokenizer(), tmp_path / "tok"
    )
    assert tokenizer_saved == [str(tmp_path / "tok")]
    # The policy worker's layout: what the converters and the DTensor policy read.
    saved = load_dcp_model_state_dict(tmp_path / "weights")
    assert all(torch.equal(saved[name], tensor) for name, tensor in model.state_dict().items())

    fresh, fresh_optimizer, fresh_scheduler = _linear(1, steps=0)  # a fresh optimizer: no state yet
    load_checkpoint(fresh, str(tmp_path / "weights"), fresh_optimizer, fresh_scheduler, tmp_path / "optimizer")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values(), strict=True))
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()
    moments = [state["exp_avg"] for state in optimizer.state.values()]
    loaded = [state["exp_avg"] for state in fresh_optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(loaded, moments, strict=True))


def test_optimizer_without_its_path_is_refused_before_writing(tmp_path: Path) -> None:
    model, optimizer, _ = _linear(0, steps=2)
    with pytest.raises(ValueError, match="optimizer_path must be given with optimizer"):
        save_checkpoint(model, tmp_path / "weights", optimizer)
    assert not (tmp_path / "weights").exists()


def test_convert_dcp_to_hf_writes_nemo_rl_s_folder(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.huggingface import TINY_LLAMA, resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_LLAMA)).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # not the built-in's weights
    save_checkpoint(model, tmp_path / "weights")
    out = tmp_path / "hf"
    returned = convert_dcp_to_hf(tmp_path / "weights", out, TINY_LLAMA, None, hf_overrides={"rms_norm_eps": 1e-5})
    assert returned == out  # as given, like NeMo-RL
    assert (out / "pytorch_model.bin").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "config.json").read_text())["rms_norm_eps"] == 1e-5
    reloaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in model.state_dict().items())

    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        convert_dcp_to_hf(str(tmp_path / "weights"), str(out), TINY_LLAMA, TINY_LLAMA)
    assert convert_dcp_to_hf(str(tmp_path / "weights"), str(out), TINY_LLAMA, TINY_LLAMA, overwrite=True) == str(out)


def test_megatron_export_checks_before_building_anything(tmp_path: Path) -> None:
    weights = tmp_path / "step_1" / "policy" / "weights"
    weights.mkdir(parents=True)
    (tmp_path / "hf").mkdir()
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        export_model_from_megatron("m", weights, tmp_path / "hf", None)
    with pytest.raises(UserInputError, match="hf_overrides: not supported yet"):
        export_model_from_megatron("m", str(weights), str(tmp_path / "out"), "m", hf_overrides={"a": 1})
    with pytest.raises(UserInputError, match=r"no config.yaml with a policy section in the 3 folders above it"):
        export_model_from_megatron("m", weights, tmp_path / "out", "m")


def test_to_torch_dtype_takes_nemo_rl_s_names() -> None:
    from nemo_rl_clone.models.megatron.community_import import to_torch_dtype

    assert to_torch_dtype("BF16") is torch.bfloat16 and to_torch_dtype("float32") is torch.float32
    assert to_torch_dtype("fp16") is torch.float16 and to_torch_dtype(torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="Unknown dtype: 'int8'"):
        to_torch_dtype("int8")
