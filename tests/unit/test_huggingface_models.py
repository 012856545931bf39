"""Model name resolution and the built-in models, built for real into a fresh cache dir.

The module builds the SmolLM2 tokenizer (from the GGUF, ~8 s), the tiny models (~1 s each) and SmolLM2-135M itself
(GGUF → fp32 safetensors, ~20 s) once; the tests then check what was written against independent references: the
GGUF tensors dequantised by the `gguf` package, a real greedy answer, exact weight equality across builds.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader, dequantize
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from nemo_rl_clone.models import huggingface as hf
from nemo_rl_clone.models.huggingface import (
    BUILTIN_MODELS,
    check_model_available,
    load_tokenizer,
    resolve_model_path,
)


@pytest.fixture(scope="module")
def fresh_cache(module_tmp_path: Path) -> Iterator[Path]:
    """``NRL_CACHE_DIR`` pointing at an empty folder for this module (so the tests build, not reuse)."""
    root = module_tmp_path / "nrl_cache"
    root.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NRL_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tiny_llama_dir(fresh_cache: Path) -> Path:
    start = time.perf_counter()
    path = Path(resolve_model_path("tiny-random-llama"))
    print(f"\ntiny-random-llama built in {time.perf_counter() - start:.1f} s (includes extracting the tokenizer)")
    return path


@pytest.fixture(scope="module")
def smollm2_dir(fresh_cache: Path, tiny_llama_dir: Path) -> Path:
    start = time.perf_counter()
    path = Path(resolve_model_path("SmolLM2-135M-Instruct"))
    print(f"\nSmolLM2-135M-Instruct converted in {time.perf_counter() - start:.1f} s (tokenizer already cached)")
    return path


def _seed_cache_with_tokenizer(source_cache: Path, new_cache: Path) -> None:
    """Copy the extracted tokenizer so a second cache builds tiny models without re-reading the GGUF."""
    rel = Path(hf._CACHE_LAYOUT) / "tokenizers" / hf.SMOLLM2
    shutil.copytree(source_cache / rel, new_cache / rel)


# --- name resolution -------------------------------------------------------------------------------------------


def test_local_folder_resolves_to_itself(tmp_path: Path) -> None:
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_unknown_name_passes_through_as_hub_id() -> None:
    assert resolve_model_path("some-org/some-model") == "some-org/some-model"


def test_missing_local_path_raises_with_choices() -> None:
    with pytest.raises(FileNotFoundError, match=r"'\./no/such/model' does not exist.*tiny-random-llama.*SmolLM2"):
        resolve_model_path("./no/such/model")


def test_unreachable_hub_model_gives_one_clear_error(fresh_cache: Path) -> None:
    # No hub here: the daemon thread gives up after 2 s. With hub access the repo does not exist (404): same error.
    with pytest.raises(OSError) as info:
        check_model_available("nemo-rl-clone-tests/no-such-model", timeout_s=2)
    message = str(info.value)
    assert "'nemo-rl-clone-tests/no-such-model' cannot be loaded" in message
    assert "a local model folder" in message
    for name in BUILTIN_MODELS:
        assert name in message


def test_check_model_available_accepts_model_folders_only(tiny_llama_dir: Path, tmp_path: Path) -> None:
    assert check_model_available(str(tiny_llama_dir)) == str(tiny_llama_dir)
    assert check_model_available("tiny-random-llama") == str(tiny_llama_dir)
    with pytest.raises(OSError, match=r"has no config\.json"):
        check_model_available(str(tmp_path))


# --- tiny models ------------------------------------------------------------------------------------------------


def test_tiny_llama_config_matches_tokenizer(tiny_llama_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_llama_dir)
    tokenizer = load_tokenizer("tiny-random-llama")
    assert config.vocab_size == len(tokenizer) == 49152
    assert config.tie_word_embeddings and config.max_position_embeddings >= 2048
    assert config.hidden_size // config.num_attention_heads == 32
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)
    assert tokenizer.pad_token_id is not None
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_tiny_weights_are_deterministic_random_and_leave_rng_alone(
    tiny_llama_dir: Path, fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed_cache_with_tokenizer(fresh_cache, tmp_path)
    monkeypatch.setenv("NRL_CACHE_DIR", str(tmp_path))
    rng_before = torch.random.get_rng_state()
    rebuilt = Path(resolve_model_path("tiny-random-llama"))
    assert torch.equal(torch.random.get_rng_state(), rng_before)

    assert rebuilt != tiny_llama_dir
    first, second = load_file(tiny_llama_dir / "model.safetensors"), load_file(rebuilt / "model.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    # Really random init (HF's normal(0, 0.02)), not zeros or a constant.
    q_proj = first["model.layers.0.self_attn.q_proj.weight"]
    assert 0.015 < q_proj.std().item() < 0.025


def test_tiny_model_loads_with_tied_head(tiny_llama_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    logits = model(torch.tensor([[1, 5, 9]])).logits
    assert logits.shape == (1, 3, 49152) and torch.isfinite(logits).all()


def test_load_tokenizer_pads_with_eos_and_needs_no_model_build(
    tiny_llama_dir: Path, fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_pad_dir = tmp_path / "no_pad"
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(no_pad_dir)
    assert AutoTokenizer.from_pretrained(no_pad_dir).pad_token is None
    reloaded = load_tokenizer(str(no_pad_dir))
    assert reloaded.pad_token == reloaded.eos_token == "<|im_end|>"

    other_cache = tmp_path / "cache"
    _seed_cache_with_tokenizer(fresh_cache, other_cache)
    monkeypatch.setenv("NRL_CACHE_DIR", str(other_cache))
    assert load_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct").encode("Hello world") == tokenizer.encode(
        "Hello world"
    )
    assert not (other_cache / hf._CACHE_LAYOUT / "models").exists()  # the 135M model was not built for it


def test_concurrent_builders_build_once(fresh_cache: Path, tiny_llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    _seed_cache_with_tokenizer(fresh_cache, tmp_path)
    monkeypatch.setenv("NRL_CACHE_DIR", str(tmp_path))
    models_dir = tmp_path / hf._CACHE_LAYOUT / "models"
    debris = models_dir / ".tmp-tiny-random-qwen2-deadbeef"  # what a killed builder leaves behind
    debris.mkdir(parents=True)
    (debris / "config.json").write_text("{ half written")

    results: list[str] = []
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            results.append(resolve_model_path("tiny-random-qwen2"))
        except BaseException as exc:  # surfaced below; a thread would swallow it
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(set(results)) == 1 and Path(results[0]) == models_dir / "tiny-random-qwen2"
    assert sorted(p.name for p in models_dir.iterdir() if not p.name.endswith(".lock")) == ["tiny-random-qwen2"]
    assert AutoConfig.from_pretrained(results[0]).model_type == "qwen2"


# --- SmolLM2-135M-Instruct --------------------------------------------------------------------------------------


def test_smollm2_alias_and_plain_config(smollm2_dir: Path) -> None:
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == str(smollm2_dir)
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert getattr(config, "quantization_config", None) is None
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings


def test_smollm2_weights_equal_independent_gguf_dequantisation(smollm2_dir: Path) -> None:
    saved = load_file(smollm2_dir / "model.safetensors")
    gguf_tensors = {t.name: t for t in GGUFReader(hf._smollm2_gguf_path()).tensors}

    def gguf(name: str) -> torch.Tensor:
        tensor = gguf_tensors[name]
        return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())

    assert torch.equal(saved["model.embed_tokens.weight"], gguf("token_embd.weight"))  # Q8_0
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])  # written explicitly, tied
    assert torch.equal(saved["model.layers.0.mlp.down_proj.weight"], gguf("blk.0.ffn_down.weight"))  # Q4_1
    assert torch.equal(saved["model.norm.weight"], gguf("output_norm.weight"))
    # llama.cpp stores q rows interleaved per head (rotary pairs); undo it: (heads, 2, half) → (heads, half, 2).
    q = gguf("blk.0.attn_q.weight")
    heads, head_dim = 9, 64
    q_hf = q.reshape(heads, head_dim // 2, 2, -1).transpose(1, 2).reshape(q.shape)
    assert torch.equal(saved["model.layers.0.self_attn.q_proj.weight"], q_hf)


def test_smollm2_answers_a_simple_question(smollm2_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    tokenizer = load_tokenizer("SmolLM2-135M-Instruct")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    output = model.generate(**inputs, max_new_tokens=10, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
