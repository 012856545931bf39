"""A catalogue of bad inputs to every entry point: each must exit with code 2, say what is wrong in at most 3 lines
of stderr that name the culprit (key, file or row), and leave no log or checkpoint directory behind.

All but the ``after-ray-start`` case fail in pre-flight or while loading data, before Ray starts. Those run in this
process through the entry point's own ``main`` (what the script runs; a process would add only its start, ~6 s a
case here), disconnected from Ray like a fresh process. Cases whose point needs a fresh interpreter run as a real
process (``process=True``): Ray started by the run, and ``HF_HUB_OFFLINE``, which huggingface_hub reads at import.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nemo_rl_clone.models.huggingface import resolve_model_path
from tests.scripts import entry_point_main

REPO = Path(__file__).resolve().parents[2]
SMOKE = {
    "grpo_math": "configs/grpo_smoke.yaml",
    "sft": "configs/sft_smoke.yaml",
    "dpo": "configs/dpo_smoke.yaml",
    "rm": "configs/rm_smoke.yaml",
    "eval": "configs/evals/eval_smoke.yaml",
}


def _write_jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _chat(i: int) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]
    }


def _pair(i: int) -> dict[str, str]:
    return {"prompt": f"What is {i} + 1?", "chosen": str(i + 1), "rejected": str(i + 2)}


# Each builder makes the files a case needs in the test's directory and returns the values its overrides refer to.
def _sft_files(tmp: Path) -> dict[str, str]:
    deep = [_chat(i) for i in range(40)]
    deep[30] = {"messages": [{"role": "user", "content": "no answer here"}]}
    return {
        "train": _write_jsonl(tmp / "train.jsonl", [_chat(i) for i in range(8)]),
        "val": _write_jsonl(tmp / "val.jsonl", [_chat(i) for i in range(4)]),
        "deep": _write_jsonl(tmp / "deep.jsonl", deep),
        "misnamed": _write_jsonl(tmp / "misnamed.jsonl", [{"conversation": _chat(0)["messages"]}]),
        "text": str(tmp / "train.txt"),
    }


def _broken_json(tmp: Path) -> dict[str, str]:
    path = tmp / "broken.jsonl"
    path.write_text(json.dumps(_chat(0)) + "\n" + '{"messages": [\n')
    return {"broken": str(path), **_sft_files(tmp)}


def _pairs(tmp: Path) -> dict[str, str]:
    no_rejected = [{k: v for k, v in _pair(i).items() if k != "rejected"} for i in range(4)]
    return {
        "pairs": _write_jsonl(tmp / "pairs.jsonl", [_pair(i) for i in range(8)]),
        "no_rejected": _write_jsonl(tmp / "no_rejected.jsonl", no_rejected),
    }


def _model_dirs(tmp: Path) -> dict[str, str]:
    """Model folders: without config.json, with an unparsable one, and with weights that cannot be read."""
    tiny = Path(resolve_model_path("tiny-random-llama"))
    (tmp / "empty_model").mkdir()
    (tmp / "bad_config").mkdir()
    (tmp / "bad_config" / "config.json").write_text("{not json")
    corrupt = tmp / "corrupt_weights"
    shutil.copytree(tiny, corrupt)
    (corrupt / "model.safetensors").write_text("not a safetensors file")
    return {
        "empty": str(tmp / "empty_model"),
        "bad_config": str(tmp / "bad_config"),
        "corrupt": str(corrupt),
        "policy_model": str(tiny),  # a causal LM: no trained score head for a reward-model environment
    }


def _math_files(tmp: Path) -> dict[str, str]:
    rows = [{"problem": f"What is {i} + 1?", "expected_answer": str(i + 1)} for i in range(30)]
    rows[25]["expected_answer"] = ""
    no_answer = [{"problem": "What is 1 + 1?", "solution": "2"}] * 4
    return {
        "local_math": _write_jsonl(tmp / "local.jsonl", [{"problem": "What is 1 + 1?", "answer": "2"}] * 4),
        "deep_math": _write_jsonl(tmp / "math.jsonl", rows),
        "no_answer": _write_jsonl(tmp / "no_answer.jsonl", no_answer),
    }


def _a_file(tmp: Path) -> dict[str, str]:
    (tmp / "a_file").write_text("")
    return {"file": str(tmp / "a_file")}


def _no_files(tmp: Path) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Case:
    id: str
    entry: str
    overrides: tuple[str, ...]
    culprit: str  # must appear on stderr
    files: Callable[[Path], dict[str, str]] = _no_files
    env: dict[str, str] = field(default_factory=dict)
    # A log dir that already holds a run: a failed start must remove only the exp_N it made.
    existing_log_dir: bool = False
    process: bool = False  # a real process (see the module docstring)


OPENAI = ("data.dataset_name=openai_format", "data.data_path={train}", "data.val_data_path={val}")
BINARY = ("data.dataset_name=binary_preference", "data.data_path={pairs}", "data.split_validation_size=0.5")
OMI2 = (
    "data.dataset_name=OpenMathInstruct-2",
    "data.reasoning_gym=null",
    "env.math={{}}",
    "++data.split_validation_size=0.2",
)

CASES = [
    # config validation (typos, wrong types)
    Case("rm-typo", "rm", ("rm.max_num_stesp=3",), "rm.max_num_stesp"),
    Case("rm-wrong-type", "rm", ("policy.train_global_batch_size=abc",), "policy.train_global_batch_size"),
    Case("eval-typo", "eval", ("eval.kvalue=1",), "eval.kvalue"),
    # models
    Case("sft-model-missing", "sft", ("policy.model_name=/nonexistent/model",), "policy.model_name"),
    Case("grpo-model-missing", "grpo_math", ("policy.model_name=/nonexistent/model",), "policy.model_name"),
    Case("dpo-model-no-config", "dpo", ("policy.model_name={empty}",), "policy.model_name", _model_dirs),
    Case("rm-model-bad-config", "rm", ("policy.model_name={bad_config}",), "config.json does not load", _model_dirs),
    Case(
        "dpo-hub-offline",
        "dpo",
        ("policy.model_name=nemo-rl-clone-tests/no-such-model",),
        "policy.model_name",
        env={"HF_HUB_OFFLINE": "1"},
        process=True,
    ),
    Case("eval-model-missing", "eval", ("generation.model_name=/nonexistent/model",), "generation.model_name"),
    # optimizer and scheduler
    Case("sft-lr-abc", "sft", ("policy.optimizer.kwargs.lr=abc",), "policy.optimizer.kwargs"),
    Case("grpo-lr-abc", "grpo_math", ("policy.optimizer.kwargs.lr=abc",), "policy.optimizer.kwargs"),
    Case("dpo-optimizer-typo", "dpo", ("policy.optimizer.name=torch.optim.AdamWW",), "torch.optim.AdamW?"),
    Case(
        "sft-scheduler-kwarg",
        "sft",
        ("++policy.scheduler=[{{name: torch.optim.lr_scheduler.LinearLR, kwargs: {{start_facter: 0.1}}}}]",),
        "policy.scheduler[0].kwargs",
    ),
    # data files
    Case(
        "sft-no-validation-source",
        "sft",
        ("data.dataset_name=openai_format", "data.data_path={train}"),
        "data.val_data_path",
        _sft_files,
    ),
    Case(
        "sft-data-missing", "sft", (*OPENAI[:1], "data.data_path={train}.gone", OPENAI[2]), "data.data_path", _sft_files
    ),
    Case("sft-data-txt", "sft", (*OPENAI[:1], "data.data_path={text}", OPENAI[2]), "unsupported file type", _sft_files),
    Case("sft-data-bad-json", "sft", (*OPENAI[:1], "data.data_path={broken}", OPENAI[2]), "line 2", _broken_json),
    Case(
        "sft-data-wrong-field", "sft", (*OPENAI[:1], "data.data_path={misnamed}", OPENAI[2]), "'messages'", _sft_files
    ),
    Case("sft-bad-row-deep", "sft", (*OPENAI[:1], "data.data_path={deep}", OPENAI[2]), "row 30", _sft_files),
    Case("dpo-missing-field", "dpo", (*BINARY[:1], "data.data_path={no_rejected}", BINARY[2]), "'rejected'", _pairs),
    Case("sft-prompt-file-missing", "sft", ("data.prompt_file=no_such_prompt.txt",), "data.prompt_file"),
    Case(
        "grpo-bad-row-deep",
        "grpo_math",
        (*OMI2, "++data.data_path={deep_math}"),
        "row 25",
        _math_files,
        existing_log_dir=True,
    ),
    Case(
        "grpo-evaluation-only-dataset",
        "grpo_math",
        ("data.dataset_name=local", "data.reasoning_gym=null", "env.math={{}}", "++data.data_path={local_math}"),
        "has no training split",
        _math_files,
    ),
    Case(
        "eval-local-no-answer",
        "eval",
        ("data.dataset_name=local", "data.reasoning_gym=null", "env.math={{}}", "data.data_path={no_answer}"),
        "field 'answer'",
        _math_files,
    ),
    Case(
        "grpo-reward-model-is-a-policy",
        "grpo_math",
        ("++data.env_name=reward_model", "env.reasoning_gym=null", "++env.reward_model.model_name={policy_model}"),
        "env.reward_model.model_name",
        _model_dirs,
    ),
    # batch sizes and cluster shape
    Case(
        "sft-gbs-not-multiple-of-dp",
        "sft",
        ("cluster.gpus_per_node=2", "policy.train_global_batch_size=3", "policy.train_micro_batch_size=1"),
        "data-parallel size 2",
    ),
    Case("rm-gbs-larger-than-data", "rm", ("policy.train_global_batch_size=4096",), "policy.train_global_batch_size"),
    Case(
        "dpo-too-many-workers",
        "dpo",
        ("cluster.gpus_per_node=512", "policy.train_global_batch_size=512", "dpo.val_global_batch_size=512"),
        "cluster.gpus_per_node",
    ),
    Case("sft-gcs-port-in-use", "sft", (), "RAY_GCS_SERVER_PORT", env={"RAY_GCS_SERVER_PORT": "{busy_port}"}),
    # directories
    Case(
        "sft-checkpoint-dir-unwritable",
        "sft",
        ("checkpointing.checkpoint_dir=/proc/nrl_ckpt",),
        "checkpointing.checkpoint_dir",
    ),
    Case("rm-log-dir-is-a-file", "rm", ("logger.log_dir={file}",), "logger.log_dir", _a_file),
    Case("eval-save-path-unwritable", "eval", ("eval.save_path=/proc/nrl/samples.jsonl",), "eval.save_path"),
    # after Ray started: a worker cannot load the model's weights (run under the shared heavy lock)
    Case(
        "after-ray-start-corrupt-weights",
        "sft",
        ("policy.model_name={corrupt}",),
        "cannot load the weights",
        _model_dirs,
        process=True,
    ),
]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


def run_case(case: Case, argv: list[str], env: dict[str, str], tmp_path: Path, monkeypatch, capfd) -> str:
    """The stderr of the entry point on ``argv``, which must exit with code 2: in this process, or as a real one for
    ``case.process``."""
    if case.process:
        args = [sys.executable, str(REPO / "examples" / f"run_{case.entry}.py"), *argv]
        proc = subprocess.run(
            args, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **env}, timeout=600
        )
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stderr
    import ray

    ray.shutdown()  # like a fresh process: an earlier module on this worker may have connected it
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    # sys.stdout/sys.stderr on the descriptors, as in a process: the entry point moves fd 2 to fd 1 while it runs,
    # which capfd's own sys.stderr (writing past the descriptor) would escape.
    for name, fd in (("stdout", 1), ("stderr", 2)):
        monkeypatch.setattr(sys, name, open(fd, "w", buffering=1, closefd=False))  # noqa: SIM115  # closed by GC
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        entry_point_main(f"run_{case.entry}")(argv)
    captured = capfd.readouterr()
    assert exit_info.value.code == 2, captured.out[-2000:] + captured.err[-4000:]
    assert not ray.is_initialized(), "the run failed after starting Ray: make it a process=True case"
    return captured.err


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_clear_error(case: Case, tmp_path: Path, busy_port: int, monkeypatch, capfd) -> None:
    values = {"busy_port": str(busy_port), **case.files(tmp_path)}
    log_dir, checkpoint_dir = tmp_path / "logs" / "run", tmp_path / "ckpt"
    dirs = [f"logger.log_dir={log_dir}"]
    if case.entry != "eval":
        dirs.append(f"checkpointing.checkpoint_dir={checkpoint_dir}")
    else:
        dirs.append(f"eval.save_path={tmp_path / 'samples.jsonl'}")
    if case.existing_log_dir:
        (log_dir / "exp_1").mkdir(parents=True)
        (log_dir / "exp_1" / "config.yaml").write_text("from an earlier run\n")
    overrides = [override.format(**values) for override in case.overrides]
    env = {k: v.format(**values) for k, v in case.env.items()}
    argv = ["--config", str(REPO / SMOKE[case.entry]), *dirs, *overrides]
    stderr = run_case(case, argv, env, tmp_path, monkeypatch, capfd)

    lines = [line for line in stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, stderr
    assert case.culprit in stderr, stderr
    assert "Traceback" not in stderr
    if case.existing_log_dir:
        assert sorted(p.name for p in log_dir.iterdir()) == ["exp_1"]
        assert (log_dir / "exp_1" / "config.yaml").read_text() == "from an earlier run\n"
    else:
        assert not (tmp_path / "logs").exists()
    assert not checkpoint_dir.exists()
    assert not (tmp_path / "samples.jsonl").exists()
