"""Consolidated HF export, DCP → HF conversion (CLI in a subprocess) and loading the export in vLLM.

Uses the built-in ``tiny-random-llama`` (tied embeddings, real SmolLM2 tokenizer) from the model cache. This file is
also a script (``python test_hf_export.py vllm-check|fsdp-save ARGS``) so vLLM and the 2-rank FSDP2 save run in
clean processes of their own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml

from tests.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
CONVERTER = REPO_ROOT / "examples" / "converters" / "convert_dcp_to_hf.py"
PROMPT_IDS = [1, 520, 33, 4000, 77, 12000, 9, 300]


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from nemo_rl_clone.models.huggingface import resolve_model_path

    return Path(resolve_model_path("tiny-random-llama"))


@pytest.fixture
def tiny_model(tiny_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


def _logits(model, ids: list[int] = PROMPT_IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _perturbed(model, seed: int = 0) -> None:
    """Move every weight away from the cached init, keeping the head tied, so a reload of stale weights shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():  # tied head = embedding: one parameter, visited once
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


def _load_converter() -> ModuleType:
    return load_script(CONVERTER)


# --- save_consolidated_hf ---------------------------------------------------------------------------------------


def test_round_trip_writes_tied_head_and_reloads_identically(tiny_model, tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_rl_clone.models.hf_export import load_hf_state_dict, save_consolidated_hf

    _perturbed(tiny_model)
    state_dict = {k: v for k, v in tiny_model.state_dict().items() if k != "lm_head.weight"}  # as save_pretrained
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    out = save_consolidated_hf(state_dict, tiny_model.config, tmp_path / "hf", tokenizer=tokenizer)

    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    saved = load_hf_state_dict(out)
    assert torch.equal(saved["lm_head.weight"], tiny_model.model.embed_tokens.weight)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_logits(reloaded), _logits(tiny_model))
    fresh = AutoModelForCausalLM.from_config(reloaded.config)
    fresh.load_state_dict(saved, strict=True)  # the file is the complete state dict
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left behind


def test_bfloat16_export_and_sharding(tiny_model, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.hf_export import SAFETENSORS_INDEX, load_hf_state_dict, save_consolidated_hf

    out = save_consolidated_hf(
        tiny_model.state_dict(), tiny_model.config, tmp_path / "hf", dtype="bfloat16", max_shard_size="4MB"
    )
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / SAFETENSORS_INDEX).is_file()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    saved = load_hf_state_dict(out)
    for key, value in tiny_model.state_dict().items():
        assert torch.equal(saved[key], value.to(torch.bfloat16)), key
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.dtype == torch.bfloat16
    assert torch.equal(
        reloaded.model.layers[1].mlp.up_proj.weight, tiny_model.model.layers[1].mlp.up_proj.weight.bfloat16()
    )


@pytest.mark.parametrize("max_shard_size", ["5GB", "4MB"])
def test_torch_save_format_writes_pytorch_model_bin(tiny_model, tmp_path: Path, max_shard_size: str) -> None:
    """checkpointing.model_save_format=torch_save: pytorch_model.bin (or its shards and index), no safetensors;
    from_pretrained gives the same logits."""
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.hf_export import TORCH_INDEX, load_hf_state_dict, save_consolidated_hf

    _perturbed(tiny_model)
    out = save_consolidated_hf(
        tiny_model.state_dict(),
        tiny_model.config,
        tmp_path / "hf",
        max_shard_size=max_shard_size,
        save_format="torch_save",
    )
    assert not list(out.glob("*.safetensors"))
    if max_shard_size == "5GB":
        assert (out / "pytorch_model.bin").is_file() and not (out / TORCH_INDEX).exists()
    else:
        assert len(list(out.glob("pytorch_model-*.bin"))) > 1 and (out / TORCH_INDEX).is_file()
    saved = load_hf_state_dict(out)
    assert saved.keys() == tiny_model.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in tiny_model.state_dict().items())
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_logits(reloaded), _logits(tiny_model))


def test_unknown_save_format_is_refused_by_name(tiny_model, tmp_path: Path) -> None:
    from nemo_rl_clone.models.hf_export import save_consolidated_hf

    with pytest.raises(ValueError, match=r"save_format must be one of \['safetensors', 'torch_save'\], got 'pickle'"):
        save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, tmp_path / "hf", save_format="pickle")
    assert not (tmp_path / "hf").exists()


def test_existing_output_needs_overwrite(tiny_model, tmp_path: Path) -> None:
    from nemo_rl_clone.models.hf_export import load_hf_state_dict, save_consolidated_hf

    out = tmp_path / "hf"
    save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, out)
    _perturbed(tiny_model, seed=1)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, out)
    save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, out, overwrite=True)
    assert torch.equal(load_hf_state_dict(out)["model.norm.weight"], tiny_model.model.norm.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_tied_head_that_differs_is_refused(tiny_model, tmp_path: Path) -> None:
    from nemo_rl_clone.models.hf_export import save_consolidated_hf

    state_dict = dict(tiny_model.state_dict())
    state_dict["lm_head.weight"] = state_dict["lm_head.weight"] + 1.0
    with pytest.raises(
        ValueError, match=r"'lm_head.weight' differs from 'model.embed_tokens.weight'.*tie_word_embeddings"
    ):
        save_consolidated_hf(state_dict, tiny_model.config, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_untied_config_needs_the_head(tiny_model, tmp_path: Path) -> None:
    from nemo_rl_clone.models.hf_export import save_consolidated_hf

    config = tiny_model.config.__class__.from_dict({**tiny_model.config.to_dict(), "tie_word_embeddings": False})
    state_dict = {k: v for k, v in tiny_model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"missing \['lm_head.weight'\], unexpected \[\]"):
        save_consolidated_hf(state_dict, config, tmp_path / "hf")


def test_bad_keys_shapes_and_values_are_named(tiny_model, tmp_path: Path) -> None:
    from nemo_rl_clone.models.hf_export import save_consolidated_hf

    good = dict(tiny_model.state_dict())
    renamed = {("_orig_mod." + k if k == "model.norm.weight" else k): v for k, v in good.items()}
    with pytest.raises(
        ValueError, match=r"missing \['model.norm.weight'\], unexpected \['_orig_mod.model.norm.weight'\]"
    ):
        save_consolidated_hf(renamed, tiny_model.config, tmp_path / "a")
    with pytest.raises(
        ValueError, match=r"state_dict\['model.norm.weight'\] has shape \(64,\), the config needs \(128,\)"
    ):
        save_consolidated_hf({**good, "model.norm.weight": torch.ones(64)}, tiny_model.config, tmp_path / "b")
    with pytest.raises(TypeError, match=r"state_dict\['model.norm.weight'\] is a list"):
        save_consolidated_hf({**good, "model.norm.weight": [1.0]}, tiny_model.config, tmp_path / "c")
    with pytest.raises(ValueError, match="dtype must be a floating-point torch dtype"):
        save_consolidated_hf(good, tiny_model.config, tmp_path / "d", dtype="int8")


# --- DCP → HF ---------------------------------------------------------------------------------------------------


def _write_step_config(step_dir: Path, model_name: str, model_save_format: str | None = None) -> Path:
    step_dir.mkdir(parents=True, exist_ok=True)
    config_path = step_dir / "config.yaml"
    config: dict = {"policy": {"model_name": model_name, "tokenizer": {"name": None}}}
    if model_save_format is not None:
        config["checkpointing"] = {"model_save_format": model_save_format}
    config_path.write_text(yaml.safe_dump(config))
    return config_path


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize(
    ("model_save_format", "weights_file"), [(None, "model.safetensors"), ("torch_save", "pytorch_model.bin")]
)
def test_single_process_dcp_converts_to_identical_model(
    tiny_model, tmp_path: Path, model_save_format: str | None, weights_file: str
) -> None:
    """The contract on one process: ``dcp.save({"model": get_model_state_dict(model)})``, then the converter, which
    writes the run's ``checkpointing.model_save_format`` (safetensors when the config has none)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from transformers import AutoModelForCausalLM

    _perturbed(tiny_model)
    step_dir = tmp_path / "step_3"
    weights_dir = step_dir / "policy" / "weights"
    dcp.save({"model": get_model_state_dict(tiny_model)}, checkpoint_id=weights_dir, no_dist=True)
    config_path = _write_step_config(step_dir, "tiny-random-llama", model_save_format)

    _load_converter().main(
        ["--config", str(config_path), "--dcp-ckpt-path", str(weights_dir), "--hf-ckpt-path", str(tmp_path / "hf")]
    )
    assert [p.name for p in (tmp_path / "hf").glob("*.safetensors")] + [
        p.name for p in (tmp_path / "hf").glob("*.bin")
    ] == [weights_file]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert torch.equal(_logits(reloaded), _logits(tiny_model))  # DCP and safetensors both keep the bits


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_converter_cli_on_fsdp2_sharded_checkpoint(tiny_model, tiny_dir: Path, tmp_path: Path) -> None:
    """Two gloo ranks save an FSDP2 (``fully_shard``) model as the policy worker does; the CLI converts it."""
    from transformers import AutoModelForCausalLM

    step_dir = tmp_path / "step_5"
    weights_dir = step_dir / "policy" / "weights"
    saved = subprocess.run(
        [sys.executable, __file__, "fsdp-save", str(tiny_dir), str(weights_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    assert len(list(weights_dir.glob("*.distcp"))) == 2  # one file per rank: really sharded
    config_path = _write_step_config(step_dir, "tiny-random-llama")
    out = tmp_path / "hf"

    converted = subprocess.run(
        [
            sys.executable,
            str(CONVERTER),
            "--config",
            str(config_path),
            "--dcp-ckpt-path",
            str(weights_dir),
            "--hf-ckpt-path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert f"wrote {out}" in converted.stdout

    _perturbed(tiny_model)  # the ranks applied the same seeded perturbation before sharding
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_logits(reloaded), _logits(tiny_model))
    assert (out / "tokenizer.json").is_file()


def test_converter_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    converter = _load_converter()
    config_path = _write_step_config(tmp_path, "tiny-random-llama")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        converter.main(
            ["--config", str(config_path), "--dcp-ckpt-path", str(empty), "--hf-ckpt-path", str(tmp_path / "o")]
        )
    assert exit_info.value.code == 1
    assert "is not a torch DCP checkpoint (no .metadata file)" in capsys.readouterr().err

    no_policy = tmp_path / "no_policy.yaml"
    no_policy.write_text("grpo: {max_num_steps: 3}\n")
    with pytest.raises(SystemExit) as exit_info:
        converter.main(
            ["--config", str(no_policy), "--dcp-ckpt-path", str(empty), "--hf-ckpt-path", str(tmp_path / "o")]
        )
    assert exit_info.value.code == 2
    assert "no 'policy' section" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_without_model_key_is_explained(tiny_model, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from nemo_rl_clone.models.hf_export import load_dcp_model_state_dict

    dcp.save({"weights": tiny_model.state_dict()}, checkpoint_id=tmp_path / "w", no_dist=True)
    with pytest.raises(ValueError, match=r"holds no 'model' state dict \(top-level keys: \['weights'\]\)"):
        load_dcp_model_state_dict(tmp_path / "w")


def _fsdp_save_rank(rank: int, world_size: int, port: int, model_dir: str, weights_dir: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        _perturbed(model)
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        state_dict = get_model_state_dict(model)
        assert all(isinstance(v, DTensor) for v in state_dict.values())
        dcp.save({"model": state_dict}, checkpoint_id=weights_dir)
        dist.barrier()  # no rank tears gloo down while the other still finishes the save's last collective
    finally:
        dist.destroy_process_group()


def _fsdp_save(model_dir: str, weights_dir: str, world_size: int = 2) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_fsdp_save_rank, args=(world_size, port, model_dir, weights_dir), nprocs=world_size)


# --- vLLM -------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_loads_export_and_reloads_tied_head_in_place(tiny_model, tiny_dir: Path, tmp_path: Path) -> None:
    """vLLM (fp32, CPU, in-process engine) on the export: prompt logprobs equal HF's; then an in-place
    ``reload_weights`` from a second export of changed weights matches HF on those weights (needs lm_head written)."""
    from transformers import AutoTokenizer

    from nemo_rl_clone.models.hf_export import save_consolidated_hf

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    first = save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, tmp_path / "first", tokenizer=tokenizer)
    expected_first = _prompt_logprobs(_logits(tiny_model))
    _perturbed(tiny_model)
    second = save_consolidated_hf(tiny_model.state_dict(), tiny_model.config, tmp_path / "second", tokenizer=tokenizer)
    expected_second = _prompt_logprobs(_logits(tiny_model))

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, __file__, "vllm-check", str(first), str(second)],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(got["first"]), expected_first, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.tensor(got["second"]), expected_second, rtol=0, atol=1e-5)


def _prompt_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log p(token_i | tokens_<i) for i ≥ 1 of PROMPT_IDS."""
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[:-1].gather(1, torch.tensor(PROMPT_IDS[1:])[:, None])[:, 0]


def _vllm_check(first: str, second: str) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(first, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=256, seed=0)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)

    def prompt_logprobs() -> list[float]:
        out = llm.generate([{"prompt_token_ids": PROMPT_IDS}], params, use_tqdm=False)[0]
        return [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], PROMPT_IDS[1:], strict=True)]

    try:
        result = {"first": prompt_logprobs()}
        llm.collective_rpc("reload_weights", kwargs={"weights_path": second})
        llm.reset_prefix_cache()  # cached prefixes hold activations of the old weights
        result["second"] = prompt_logprobs()
    finally:
        llm.llm_engine.engine_core.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    {"vllm-check": _vllm_check, "fsdp-save": _fsdp_save}[sys.argv[1]](*sys.argv[2:])
