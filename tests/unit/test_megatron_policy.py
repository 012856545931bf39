"""`MegatronPolicyWorker` in spawned gloo processes (no Ray), against Hugging Face, the DTensor worker and itself at
other parallel layouts.

A tiny random Llama (4 layers, 4 heads / 2 KV heads, vocab 128, tied embeddings) trains 3 Adam steps (clip_grad
active, a warming-up LR) on 3 batches of 8 right-padded rows with prompt and sample masks. To keep the file fast on
2 cores, each scenario is one spawn run once in a module fixture and the tests assert on what it recorded:

- ``single``: one process. The DTensor worker's logprobs, then the Megatron worker at TP=PP=DP=1: logprobs, an HF
  export at init, 3 steps with the refit state dict after each, an HF export after step 1 and a run checkpoint
  (``step_2/policy/{weights,optimizer,tokenizer}``) after step 2.
- ``tp2`` / ``dp2`` / ``pp2_uneven_recompute`` (1 + 3 layers, full recomputation): two processes, the same 3
  steps; ``dp2`` with the fused linear cross-entropy (``use_linear_ce_fusion_loss``). Then ``single``, ``tp2`` and
  ``pp2_uneven_recompute`` give the top-k logits a distillation teacher hands on and take one step of the student's
  KL loss (whole-vocabulary logits).
- ``resumed``: two processes at TP=2 with sequence parallelism and the fused linear cross-entropy, loading
  ``single``'s step-2 checkpoint, taking step 3 and saving its weights
  (``step_3/policy/{weights,tokenizer}``).
- the converter CLI (``examples/converters/convert_megatron_to_hf.py``, one process at TP=1) on that TP=2
  checkpoint.

Tolerances are for fp32: the layouts only reorder float sums (measured ≤ 2e-6, the weights after TP=2 Adam steps).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.models.policy.config import PolicyConfig
from nemo_rl_clone.utils.config_validation import validate_config
from tests.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
CONVERTER = REPO_ROOT / "examples" / "converters" / "convert_megatron_to_hf.py"
VOCAB, SEQ, ROWS, STEPS = 128, 16, 8, 3
PROMPT_TOKENS = 3
LR, WARMUP_INIT_LR, WARMUP_STEPS = 1e-3, 1e-4, 3  # the LR differs at every step: a reset on resume shows
ATOL = 1e-5


# ---------------------------------------------------------------------------- spawning
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(
    rank: int,
    world: int,
    port: int,
    out: str,
    fn: Callable[..., Any],
    args: tuple,
    cuda: bool,
    env: dict[str, str],
    cwd: str,
) -> None:
    # The caller's environment and working folder now, not the forkserver's when it started.
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU everywhere, GPU machines included
    torch.set_num_threads(max(1, 2 // world))
    result = fn(*args)
    if rank == 0:
        torch.save(result, out)


# Attempts of a spawn whose process group found its free port taken: beside another xdist worker, a port found free
# can be bound by someone else before the group listens on it (EADDRINUSE).
PORT_ATTEMPTS = 3


def spawn(world: int, fn: Callable[..., Any], *args: Any, cuda: bool = False, writes: str | Path | None = None) -> Any:
    """Run ``fn(*args)`` in ``world`` processes joined as one process group (on a free port; gloo on CPU, or one GPU
    each with ``cuda``), forked from the suite's forkserver with the caller's environment; rank 0's result. Run again, on another port, when the port was taken meanwhile;
    ``writes``, the folder ``fn`` writes its checkpoints to, is removed first so the second attempt does not meet
    the first one's files (an HF export refuses a non-empty folder)."""
    for attempt in range(PORT_ATTEMPTS):
        if attempt and writes is not None:
            shutil.rmtree(writes, ignore_errors=True)
            Path(writes).mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "result.pt")
            try:
                mp.start_processes(  # forked from the forkserver: FORKSERVER_PRELOAD in tests/conftest.py
                    _child,
                    args=(world, free_port(), out, fn, args, cuda, dict(os.environ), os.getcwd()),
                    nprocs=world,
                    join=True,
                    start_method="forkserver",
                )
            except mp.ProcessRaisedException as error:
                if "EADDRINUSE" in str(error) and attempt + 1 < PORT_ATTEMPTS:
                    continue
                raise
            return torch.load(out, weights_only=False)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------- model, data, config
def build_tiny_llama(out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from nemo_rl_clone.models.huggingface import TINY_LLAMA, load_tokenizer, resolve_model_path

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out_dir)
    # Only saved alongside (checkpoints and exports copy it); the batches are random ids below the model's vocab.
    load_tokenizer(resolve_model_path(TINY_LLAMA)).save_pretrained(out_dir)


def make_batches() -> list[BatchedDataDict]:
    generator = torch.Generator().manual_seed(1)
    batches = []
    for step in range(STEPS):
        input_ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=generator)
        lengths = torch.randint(PROMPT_TOKENS + 2, SEQ + 1, (ROWS,), generator=generator)
        lengths[step] = SEQ
        positions = torch.arange(SEQ)
        valid = positions < lengths[:, None]
        input_ids = torch.where(valid, input_ids, 0)
        sample_mask = torch.ones(ROWS)
        sample_mask[ROWS - 1 - step] = 0  # contributes nothing
        batches.append(
            BatchedDataDict(
                input_ids=input_ids,
                input_lengths=lengths,
                token_mask=(valid & (positions >= PROMPT_TOKENS)).float(),
                sample_mask=sample_mask,
            )
        )
    return batches


TOPK = 4


def distillation_batch(model_dir: str, data: BatchedDataDict) -> BatchedDataDict:
    """``data`` with a teacher's top-k logits (the initial model's, from Hugging Face) for a distillation step."""
    from transformers import AutoModelForCausalLM

    from nemo_rl_clone.models.policy.workers.topk_logits import topk_of_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"]).logits
    values, indices = topk_of_logits(logits, TOPK, data["input_lengths"], data["input_ids"].shape[1])
    return BatchedDataDict({**data, "teacher_topk_logits": values, "teacher_topk_indices": indices})


def policy_dict(
    model_dir: str, tp: int = 1, pp: int = 1, *, precision: str = "float32", **megatron: Any
) -> dict[str, Any]:
    """The ``policy`` section of a Megatron run (NeMo-RL key names); ``megatron``: more ``megatron_cfg`` keys."""
    return {
        "model_name": model_dir,
        "train_global_batch_size": ROWS,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 3,
        "precision": precision,
        "max_grad_norm": 1.0,
        "optimizer": None,
        "scheduler": None,
        "dtensor_cfg": {"enabled": False},
        "megatron_cfg": {
            "enabled": True,
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "empty_unused_memory_level": 0,
            "optimizer": {
                "optimizer": "adam",
                "lr": LR,
                "min_lr": LR,
                "weight_decay": 0.01,
                "clip_grad": 1.0,
                "use_distributed_optimizer": True,
            },
            "scheduler": {
                "start_weight_decay": 0.01,
                "end_weight_decay": 0.01,
                "lr_decay_style": "constant",
                "lr_decay_iters": None,
                "lr_warmup_iters": WARMUP_STEPS,
                "lr_warmup_init": WARMUP_INIT_LR,
            },
            "distributed_data_parallel_config": {
                "grad_reduce_in_fp32": True,
                "overlap_grad_reduce": False,
                "overlap_param_gather": False,
            },
            **megatron,
        },
    }


def megatron_config(model_dir: str, tp: int = 1, pp: int = 1, **megatron: Any) -> PolicyConfig:
    return validate_config(policy_dict(model_dir, tp, pp, **megatron), PolicyConfig)


def dtensor_config(model_dir: str) -> PolicyConfig:
    return validate_config(
        {"model_name": model_dir, "precision": "float32", "train_global_batch_size": ROWS, "logprob_batch_size": 3},
        PolicyConfig,
    )


def hf_logprobs(model_dir: str, data: BatchedDataDict, model: Any = None) -> torch.Tensor:
    """[B, S] policy-layout logprobs of one plain HF forward (0 at position 0 and on padding); ``model``: an HF
    model to run instead of ``model_dir``'s."""
    from transformers import AutoModelForCausalLM

    model = model or AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    input_ids = data["input_ids"]
    with torch.no_grad():
        logits = model.eval()(input_ids=input_ids).logits.float()
    next_token = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logprobs = torch.cat([torch.zeros(len(input_ids), 1), next_token], dim=1)
    return torch.where(torch.arange(input_ids.shape[1]) < data["input_lengths"][:, None], logprobs, 0.0)


def tiny_llama_dir(folder: Path) -> str:
    """`build_tiny_llama` into ``folder / "tiny_llama"`` (a module fixture's folder); its path."""
    out = folder / "tiny_llama"
    build_tiny_llama(out)
    return str(out)


def max_diff(a: Any, b: Any) -> float:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max(max_diff(a[key], b[key]) for key in a)
    return (torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs().max().item()


# ---------------------------------------------------------------------------- scenarios (run in the children)
def _megatron_worker(model_dir: str, tp: int, pp: int, megatron: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    config = megatron_config(model_dir, tp, pp, **(megatron or {}))
    return MegatronPolicyWorker(config, load_tokenizer(model_dir), model_dir, **kwargs)


def _step(worker: Any, data: BatchedDataDict, loss_fn: Any = None) -> dict[str, Any]:
    """One optimizer step (NLL unless ``loss_fn``) on this rank's data-parallel shard of ``data``."""
    from megatron.core import parallel_state

    from nemo_rl_clone.algorithms.loss import NLLLossFn

    dp_size = parallel_state.get_data_parallel_world_size()
    shard = data.shard_by_batch_size(dp_size)[parallel_state.get_data_parallel_rank()] if dp_size > 1 else data
    result = worker.train(shard, loss_fn or NLLLossFn(), gbs=ROWS)
    return {
        "loss": result["global_loss"].item(),
        "grad_norm": result["grad_norm"].item(),
        "lr": result["all_mb_metrics"]["lr"][0],
        "state": worker.get_full_state_dict_for_refit(),
    }


def run_single(
    model_dir: str, run_dir: str, batches: list[BatchedDataDict], distill: BatchedDataDict
) -> dict[str, Any]:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.dtensor.policy_worker import DTensorPolicyWorker

    dtensor = DTensorPolicyWorker(
        dtensor_config(model_dir),
        load_tokenizer(model_dir),
        model_dir,
        init_optimizer=False,
        init_reference_model=False,
    )
    result: dict[str, Any] = {"dtensor_logprobs": dtensor.get_logprobs(batches[0])["logprobs"]}
    dtensor.shutdown()
    os.environ["MASTER_PORT"] = str(free_port())  # a fresh process group for the Megatron worker

    run = Path(run_dir)
    worker = _megatron_worker(model_dir, 1, 1)
    result["logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    result["reference_logprobs"] = worker.get_reference_policy_logprobs(batches[0])["reference_logprobs"]
    worker.save_checkpoint(str(run / "init" / "weights"), save_hf_path=str(run / "hf_init"))
    result["steps"] = []
    for index, data in enumerate(batches):
        result["steps"].append(_step(worker, data))
        if index == 0:
            worker.save_checkpoint(str(run / "step_1" / "weights"), save_hf_path=str(run / "hf_step_1"))
        if index == 1:
            policy = run / "step_2" / "policy"
            worker.save_checkpoint(
                str(policy / "weights"), str(policy / "optimizer"), tokenizer_path=str(policy / "tokenizer")
            )
    result["final_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    result["reference_logprobs_after_training"] = worker.get_reference_policy_logprobs(batches[0])["reference_logprobs"]
    result.update(_topk_and_distillation_step(worker, distill))
    worker.shutdown()
    return result


def _topk_and_distillation_step(worker: Any, distill: BatchedDataDict) -> dict[str, Any]:
    """The top-k a distillation teacher hands on, then one step of the student's KL loss (needs the whole
    vocabulary's logits: gathered over tensor-parallel ranks)."""
    from nemo_rl_clone.algorithms.loss.distillation import DistillationLossFn

    topk = worker.get_topk_logits(distill, k=TOPK)
    return {"topk": dict(topk), "distill": _step(worker, distill, DistillationLossFn())}


def run_layout(
    model_dir: str,
    batches: list[BatchedDataDict],
    distill: BatchedDataDict,
    tp: int,
    pp: int,
    megatron: dict[str, Any],
) -> dict[str, Any]:
    worker = _megatron_worker(model_dir, tp, pp, megatron)
    result = {"logprobs": worker.get_logprobs(batches[0])["logprobs"]}
    result["steps"] = [_step(worker, data) for data in batches]
    result["final_logprobs"] = worker.get_logprobs(batches[0])["logprobs"]
    if not megatron.get("use_linear_ce_fusion_loss"):  # the fused head serves token-logprob losses only
        result.update(_topk_and_distillation_step(worker, distill))
    worker.shutdown()
    return result


def run_resumed(
    model_dir: str,
    policy_dir: str,
    save_dir: str,
    batches: list[BatchedDataDict],
    tp: int,
    pp: int,
    megatron: dict[str, Any],
) -> dict[str, Any]:
    """Resume from ``policy_dir`` at this layout, take step 3, save its weights (and tokenizer) to ``save_dir``."""
    worker = _megatron_worker(
        model_dir, tp, pp, megatron, weights_path=f"{policy_dir}/weights", optimizer_path=f"{policy_dir}/optimizer"
    )
    result = {"reference_logprobs": worker.get_reference_policy_logprobs(batches[0])["reference_logprobs"]}
    result["step"] = _step(worker, batches[2])
    worker.save_checkpoint(f"{save_dir}/weights", tokenizer_path=f"{save_dir}/tokenizer")
    worker.shutdown()
    return result


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model_dir(module_tmp_path: Path) -> str:
    return tiny_llama_dir(module_tmp_path)


@pytest.fixture(scope="module")
def batches() -> list[BatchedDataDict]:
    return make_batches()


@pytest.fixture(scope="module")
def run_dir(module_tmp_path: Path) -> Path:
    return module_tmp_path / "megatron_run"


@pytest.fixture(scope="module")
def distill(model_dir: str, batches: list[BatchedDataDict]) -> BatchedDataDict:
    return distillation_batch(model_dir, batches[0])


@pytest.fixture(scope="module")
def single(model_dir: str, run_dir: Path, batches: list[BatchedDataDict], distill: BatchedDataDict) -> dict[str, Any]:
    return spawn(1, run_single, model_dir, str(run_dir), batches, distill, writes=run_dir)


# The fused linear cross-entropy (use_linear_ce_fusion_loss: token logprobs from hidden states, in chunks of a size
# that divides no row) runs in dp2 and, under sequence parallelism over TP=2, in the resumed layout.
LINEAR_CE = {"use_linear_ce_fusion_loss": True, "linear_ce_fusion_chunk_size": 5}
LAYOUTS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "tp2": (2, 1, {}),
    "dp2": (1, 1, LINEAR_CE),
    # Pipeline parallelism with uneven stages (1 + 3 layers) and full activation recomputation: the same numbers
    # again. (An even split is the default case of the same stage assignment, so it has no run of its own.)
    "pp2_uneven_recompute": (1, 2, {"num_layers_in_first_pipeline_stage": 1, "activation_checkpointing": True}),
}
# TP=2 over the 2 processes, with sequence parallelism (the norms' gradients are summed over the TP ranks).
RESUMED_LAYOUT = (2, 1, {"sequence_parallel": True, **LINEAR_CE, "linear_ce_fusion_chunk_size": 3})


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(
    request: pytest.FixtureRequest, model_dir: str, batches: list[BatchedDataDict], distill: BatchedDataDict
) -> dict[str, Any]:
    return spawn(2, run_layout, model_dir, batches, distill, *LAYOUTS[request.param])


@pytest.fixture(scope="module")
def resumed(single: dict, model_dir: str, run_dir: Path, batches: list[BatchedDataDict]) -> dict[str, Any]:
    policy_dirs = [str(run_dir / step / "policy") for step in ("step_2", "step_3")]
    return spawn(2, run_resumed, model_dir, *policy_dirs, batches, *RESUMED_LAYOUT)


# ---------------------------------------------------------------------------- tests
def test_logprobs_equal_hf_and_the_dtensor_worker(single: dict, model_dir: str, batches: list) -> None:
    expected = hf_logprobs(model_dir, batches[0])
    assert single["logprobs"].shape == expected.shape
    assert max_diff(single["logprobs"], expected) <= ATOL
    assert max_diff(single["logprobs"], single["dtensor_logprobs"]) <= ATOL
    assert torch.equal(single["reference_logprobs"], single["logprobs"])
    # Training moved the weights; the reference model stayed the initial one.
    assert max_diff(single["final_logprobs"], expected) > 1e-3
    assert torch.equal(single["reference_logprobs_after_training"], single["reference_logprobs"])


def test_layout_trains_like_one_process(layout: dict, single: dict) -> None:
    """TP=2, PP=2 (also uneven, with activation recomputation) and DP=2 each give TP=PP=DP=1's logprobs, losses,
    grad norms and weights over 3 steps, then its top-k logits and a distillation step."""
    assert max_diff(layout["logprobs"], single["logprobs"]) <= ATOL
    for got, want in zip(layout["steps"], single["steps"], strict=True):
        assert abs(got["loss"] - want["loss"]) <= ATOL
        assert abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
        assert got["lr"] == want["lr"]
        assert max_diff(got["state"], want["state"]) <= ATOL
    assert max_diff(layout["final_logprobs"], single["final_logprobs"]) <= ATOL
    assert all(step["grad_norm"] > 1.0 for step in single["steps"])  # clip_grad=1.0 really clips
    # A distillation teacher's top-k (the whole vocabulary's, over TP ranks and from the last pipeline stage), then a
    # step of the student's KL loss on whole logits.
    if "topk" not in layout:
        return
    assert torch.equal(layout["topk"]["topk_indices"], single["topk"]["topk_indices"])
    assert max_diff(layout["topk"]["topk_logits"], single["topk"]["topk_logits"]) <= ATOL
    got, want = layout["distill"], single["distill"]
    assert want["loss"] > 0 and want["grad_norm"] > 0  # the student is 3 steps away from the teacher
    assert abs(got["loss"] - want["loss"]) <= ATOL and abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
    assert max_diff(got["state"], want["state"]) <= ATOL


def test_checkpoint_resumes_at_another_layout(resumed: dict, single: dict) -> None:
    """2 steps at TP=1, saved; a new 2-process world at TP=2 with sequence parallelism loads weights, optimizer and
    scheduler; its step 3 equals the third of 3 straight steps."""
    want = single["steps"][2]
    got = resumed["step"]
    assert abs(got["loss"] - want["loss"]) <= ATOL
    assert abs(got["grad_norm"] - want["grad_norm"]) <= ATOL
    assert got["lr"] == pytest.approx(want["lr"], abs=1e-12)
    assert len({step["lr"] for step in single["steps"]}) == STEPS  # the LR really changes at every step
    assert max_diff(got["state"], want["state"]) <= ATOL
    # The reference model is the Hugging Face one, not the loaded checkpoint.
    assert max_diff(resumed["reference_logprobs"], single["reference_logprobs"]) <= ATOL


def test_hf_export_at_init_is_the_input_model(single: dict, model_dir: str, run_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(run_dir / "hf_init", dtype=torch.float32).state_dict()
    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert exported.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    assert (run_dir / "hf_init" / "tokenizer.json").is_file()


def test_hf_export_after_a_step_is_the_refit_state(single: dict, run_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(run_dir / "hf_step_1", dtype=torch.float32).state_dict()
    refit = single["steps"][0]["state"]
    assert exported.keys() == refit.keys()
    for name, tensor in refit.items():
        assert torch.equal(exported[name], tensor), name


def _write_run_config(step_dir: Path, model_dir: str, tp: int = 1, pp: int = 1, megatron: dict | None = None) -> Path:
    """``step_N/config.yaml`` as a run saves it (the policy section is what the converter reads)."""
    step_dir.mkdir(parents=True, exist_ok=True)
    config_path = step_dir / "config.yaml"
    policy = policy_dict(model_dir, tp, pp, **(megatron or {}))
    config = {"policy": policy, "checkpointing": {"model_save_format": "safetensors"}}
    config_path.write_text(yaml.safe_dump(config))
    return config_path


def test_converter_cli_writes_the_checkpoint_as_hf(resumed: dict, model_dir: str, run_dir: Path) -> None:
    """The step-3 weights saved by the TP=2 world, converted in one process (TP=1), are its refit state dict."""
    from transformers import AutoModelForCausalLM

    step_dir = run_dir / "step_3"
    config_path = _write_run_config(step_dir, model_dir, *RESUMED_LAYOUT)
    out = run_dir / "converted_step_3"
    converted = subprocess.run(
        [
            sys.executable,
            str(CONVERTER),
            "--config",
            str(config_path),
            "--megatron-ckpt-path",
            str(step_dir / "policy" / "weights"),
            "--hf-ckpt-path",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert converted.returncode == 0, converted.stderr[-3000:]
    assert f"wrote {out}" in converted.stdout
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    refit = resumed["step"]["state"]
    assert exported.keys() == refit.keys()
    for name, tensor in refit.items():
        assert torch.equal(exported[name], tensor), name
    assert (out / "tokenizer.json").is_file()  # the checkpoint's policy/tokenizer


def _load_converter() -> Any:
    return load_script(CONVERTER)


def test_converter_refuses_dtensor_runs_and_other_folders(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before any model is built (no process group): exit 2 for the config, 1 for the files."""
    main = _load_converter().main
    weights = tmp_path / "step_1" / "policy" / "weights"
    weights.mkdir(parents=True)
    (weights / ".metadata").write_text("")  # a DCP folder, as the DTensor backend writes
    dtensor_run = tmp_path / "dtensor.yaml"
    dtensor_run.write_text(yaml.safe_dump({"policy": {"model_name": model_dir}}))
    args = ["--megatron-ckpt-path", str(weights), "--hf-ckpt-path", str(tmp_path / "hf")]

    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(dtensor_run), *args])
    assert exit_info.value.code == 2
    assert "policy.megatron_cfg.enabled is not true" in capsys.readouterr().err

    megatron_run = _write_run_config(tmp_path / "step_1", model_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(megatron_run), *args])
    assert exit_info.value.code == 1
    assert "is not a Megatron distributed checkpoint (no metadata.json)" in capsys.readouterr().err

    broken = tmp_path / "broken.yaml"
    policy = policy_dict(model_dir)
    policy["megatron_cfg"]["converter_type"] = "GPT2LMHeadModel"
    broken.write_text(yaml.safe_dump({"policy": policy}))
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(broken), *args])
    assert exit_info.value.code == 2
    assert (
        f"{broken}: policy.megatron_cfg.converter_type: not supported yet: 'GPT2LMHeadModel'" in capsys.readouterr().err
    )


# ---------------------------------------------------------------------------- GPU (skipped without CUDA)
def run_bf16(model_dir: str, batches: list[BatchedDataDict]) -> dict[str, Any]:
    from nemo_rl_clone.models.huggingface import load_tokenizer
    from nemo_rl_clone.models.policy.megatron.policy_worker import MegatronPolicyWorker

    config = validate_config(policy_dict(model_dir, precision="bfloat16"), PolicyConfig)
    worker = MegatronPolicyWorker(config, load_tokenizer(model_dir), model_dir)
    result = {"logprobs": worker.get_logprobs(batches[0])["logprobs"]}
    result["steps"] = [_step(worker, data) for data in batches]
    worker.shutdown()
    return result


@pytest.mark.gpu
def test_gpu_bf16_tracks_fp32(single: dict, model_dir: str, batches: list[BatchedDataDict]) -> None:
    """bf16 compute (Float16Module) with fp32 main weights on one GPU: close to the fp32 CPU run, refit in bf16."""
    record = spawn(1, run_bf16, model_dir, batches, cuda=True)
    torch.testing.assert_close(record["logprobs"], single["logprobs"], atol=0.1, rtol=0.02)
    for got, want in zip(record["steps"], single["steps"], strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-2)
        assert {tensor.dtype for tensor in got["state"].values()} == {torch.bfloat16}
