"""examples/kuberay/rayjob_grpo_math.yaml without Kubernetes: it parses, its entry point names files of the repo and a
config that validates, and cluster.* fits the worker pods it declares (the check the job's pre-flight will make).
Whether KubeRay accepts and runs it is untested here."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_rl_clone.algorithms.grpo.config import GRPOMasterConfig
from nemo_rl_clone.distributed.cluster_fit import NodeResources, check_cluster_shape
from nemo_rl_clone.utils.config import load_validated_config

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "kuberay" / "rayjob_grpo_math.yaml"
IMAGE_WORKDIR = "/workspace/nemo_rl_clone"  # WORKDIR of docker/Dockerfile


@pytest.fixture(scope="module")
def rayjob() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def _entrypoint_args(rayjob: dict[str, Any]) -> list[str]:
    """The arguments after ``uv run --no-sync`` (the entry point is ``cd <workdir> && uv run --no-sync ...``)."""
    cd, run = rayjob["spec"]["entrypoint"].split("&&")
    assert shlex.split(cd) == ["cd", IMAGE_WORKDIR]
    words = shlex.split(run)
    assert words[:3] == ["uv", "run", "--no-sync"]  # never re-sync the image's environment at run time
    return words[3:]


def _containers(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    spec = rayjob["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [container for group in groups for container in group["template"]["spec"]["containers"]]


def test_manifest_is_a_rayjob_on_the_project_image(rayjob):
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    for container in _containers(rayjob):
        assert container["image"] == "nemo-rl-clone:cpu"
        env = {item["name"]: item["value"] for item in container["env"]}
        assert env["UV_PROJECT_ENVIRONMENT"] == f"{IMAGE_WORKDIR}/.venv"
        assert env["PATH"].startswith(f"{IMAGE_WORKDIR}/.venv/bin:")  # `ray start` is run from the PATH


def test_entrypoint_files_exist_and_its_config_validates(rayjob):
    script, flag, config, *overrides = _entrypoint_args(rayjob)
    assert (REPO / script).is_file() and flag == "--config" and (REPO / config).is_file()
    validated = load_validated_config(REPO / config, overrides, GRPOMasterConfig)
    assert validated.logger.log_dir.startswith("/results/")  # the volume every pod mounts
    assert validated.checkpointing.checkpoint_dir.startswith("/results/")
    mounts = [[mount["mountPath"] for mount in container["volumeMounts"]] for container in _containers(rayjob)]
    assert all("/results" in paths for paths in mounts)


def test_cluster_keys_fit_the_declared_pods(rayjob):
    _, _, config, *overrides = _entrypoint_args(rayjob)
    validated = load_validated_config(REPO / config, overrides, GRPOMasterConfig)
    spec = rayjob["spec"]["rayClusterSpec"]
    head = NodeResources(cpus=float(spec["headGroupSpec"]["rayStartParams"]["num-cpus"]), gpus=0)
    workers = [
        NodeResources(cpus=float(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]), gpus=0)
        for group in spec["workerGroupSpecs"]
        for _ in range(group["replicas"])
    ]
    shape = {"cluster": (validated.cluster.gpus_per_node, validated.cluster.num_nodes)}
    assert check_cluster_shape([head, *workers], shape, use_gpus=False, where="the RayJob's cluster") == []
