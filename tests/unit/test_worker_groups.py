"""RayWorkerGroup, dispatch planning and per-actor Python environments, on a real local Ray cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import numpy as np
import pytest
import ray

from nemo_rl_clone.distributed.named_sharding import NamedSharding
from nemo_rl_clone.distributed.ray_actor_environment import (
    FORCE_REBUILD_ENV_VAR,
    PY_EXECUTABLES,
    UvEnvironment,
    ensure_uv_environment,
    get_actor_python_executable,
    register_actor_environment,
    unregister_actor_environment,
    uv_sync_command,
    uv_sync_environ,
)
from nemo_rl_clone.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl_clone.distributed.worker_groups import (
    MultiWorkerFuture,
    RayWorkerBuilder,
    RayWorkerGroup,
    plan_sharded_dispatch,
)
from nemo_rl_clone.distributed.worker_placement import COLLECTIVE_TIMEOUT_ENV, DISTRIBUTED_ENV_VARS
from tests.unit.ray_test_actors import MODULE

ECHO = f"{MODULE}.RankEchoActor"
DP_TP = ["data_parallel", "tensor_parallel"]


# ---- dispatch planning (no Ray) -------------------------------------------------------------------------------


def test_plan_dp_only_gives_each_rank_its_piece():
    plan = plan_sharded_dispatch(
        NamedSharding([0, 1, 2], ["data_parallel"]), ["a", "b", "c"], ["data_parallel"], [], []
    )
    assert plan.worker_data == {0: "a", 1: "b", 2: "c"}
    assert plan.return_ranks == [0, 1, 2]


def test_plan_replicates_on_tp_and_returns_one_copy_per_dp_rank():
    # Transposed layout: rank r sits at (dp = r % 2, tp = r // 2), so pieces and returned ranks follow coordinates.
    sharding = NamedSharding([[0, 2], [1, 3]], DP_TP)
    plan = plan_sharded_dispatch(sharding, ["p0", "p1"], ["data_parallel"], ["tensor_parallel"], ["tensor_parallel"])
    assert plan.worker_data == {0: "p0", 1: "p1", 2: "p0", 3: "p1"}
    assert plan.return_ranks == [0, 1]


def test_plan_nested_data_over_two_sharded_axes():
    sharding = NamedSharding(np.arange(6).reshape(2, 3), ["data_parallel", "context_parallel"])
    data = [["a0", "a1", "a2"], ["b0", "b1", "b2"]]
    plan = plan_sharded_dispatch(sharding, data, ["data_parallel", "context_parallel"], [], ["context_parallel"])
    assert plan.worker_data == {0: "a0", 1: "a1", 2: "a2", 3: "b0", 4: "b1", 5: "b2"}
    assert plan.return_ranks == [0, 3]


def test_plan_free_axes_call_only_coordinate_zero_unless_dummy_calls():
    sharding = NamedSharding(np.arange(4).reshape(2, 2), DP_TP)
    plan = plan_sharded_dispatch(sharding, ["p0", "p1"], ["data_parallel"], [], [])
    assert plan.worker_data == {0: "p0", 2: "p1"}
    assert plan.return_ranks == [0, 2]
    plan = plan_sharded_dispatch(sharding, ["p0", "p1"], ["data_parallel"], [], [], make_dummy_calls_to_free_axes=True)
    assert plan.worker_data == {0: "p0", 1: None, 2: "p1", 3: None}
    assert plan.return_ranks == [0, 2]


@pytest.mark.parametrize(
    ("data", "sharded", "replicated", "output", "message"),
    [
        (["a", "b"], ["pipeline_parallel"], [], [], r"in_sharded_axes names unknown axes \['pipeline_parallel'\]"),
        (["a", "b"], ["data_parallel"], ["data_parallel"], [], r"axes \['data_parallel'\] are in both"),
        (["a", "b"], ["data_parallel"], [], ["expert_parallel"], "output_is_replicated names unknown axes"),
        (["a", "b", "c"], ["data_parallel"], [], [], "data has 3 pieces but axis 'data_parallel' has size 2"),
        ({"x": 1}, ["data_parallel"], [], [], "data must be a list of 2 pieces for axis 'data_parallel'"),
        ([["a", "b"], ["c"]], DP_TP, [], [], r"data\[1\] has 1 pieces but axis 'tensor_parallel' has size 2"),
    ],
)
def test_plan_rejects_bad_axes_and_shapes(data, sharded, replicated, output, message):
    sharding = NamedSharding(np.arange(4).reshape(2, 2), DP_TP)
    with pytest.raises(ValueError, match=message):
        plan_sharded_dispatch(sharding, data, sharded, replicated, output)


# ---- worker groups on Ray -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dp_group(ray_local):
    """Two workers on one node, data parallel only."""
    cluster = RayVirtualCluster([2], use_gpus=False, name="t-dp")
    group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO, tag="dp"), name_prefix="t-dp", env_vars={"NRL_TEST": "yes"})
    yield group
    group.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def dp_tp_group(ray_local):
    """Four workers on two logical nodes (two placement groups), dp=2 x tp=2."""
    cluster = RayVirtualCluster([2, 2], use_gpus=False, name="t-dptp")
    sharding = NamedSharding(np.arange(4).reshape(2, 2), DP_TP)
    group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), sharding_annotations=sharding)
    yield group
    group.shutdown()
    cluster.shutdown()


def test_dp_sharded_data_comes_back_in_rank_order(dp_group):
    future = dp_group.run_all_workers_sharded_data(
        "echo", [[1, 2], [3, 4]], in_sharded_axes=["data_parallel"], common_kwargs={"scale": 10}
    )
    assert isinstance(future, MultiWorkerFuture)
    assert dp_group.get_all_worker_results(future) == [(0, [10, 20]), (1, [30, 40])]
    assert dp_group.dp_size == 2


def test_distributed_env_vars_per_rank(dp_group, dp_tp_group):
    keys = [*DISTRIBUTED_ENV_VARS, "NRL_TEST"]
    env = ray.get(dp_group.run_all_workers_single_data("get_env", keys))
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["WORLD_SIZE"]) for e in env] == [
        ("0", "0", "0", "2"),
        ("1", "1", "0", "2"),
    ]
    assert env[0]["MASTER_ADDR"] == env[1]["MASTER_ADDR"] == ray.util.get_node_ip_address()
    assert env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"] and int(env[0]["MASTER_PORT"]) > 0
    assert env[0]["NRL_TEST"] == env[1]["NRL_TEST"] == "yes"

    env = ray.get(dp_tp_group.run_all_workers_single_data("get_env", keys))
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["WORLD_SIZE"]) for e in env] == [
        ("0", "0", "0", "4"),
        ("1", "1", "0", "4"),
        ("2", "0", "1", "4"),
        ("3", "1", "1", "4"),
    ]
    assert env[0]["NRL_TEST"] is None  # env_vars belong to their group only
    # Each group rendezvouses on its own port.
    assert env[0]["MASTER_PORT"] != ray.get(dp_group.run_single_worker_single_data("get_env", 0, keys))["MASTER_PORT"]


def test_dp_tp_sharded_with_replicated_tp_output(dp_tp_group, dp_group):
    future = dp_tp_group.run_all_workers_sharded_data(
        "echo",
        ["p0", "p1"],
        in_sharded_axes=["data_parallel"],
        replicate_on_axes=["tensor_parallel"],
        output_is_replicated=["tensor_parallel"],
    )
    assert future.get_results(dp_tp_group) == [(0, "p0"), (2, "p1")]
    # Without output replication every worker's result comes back: tp ranks got the same piece.
    future = dp_tp_group.run_all_workers_sharded_data(
        "echo", ["p0", "p1"], in_sharded_axes=["data_parallel"], replicate_on_axes=["tensor_parallel"]
    )
    assert future.get_results() == [(0, "p0"), (1, "p0"), (2, "p1"), (3, "p1")]
    with pytest.raises(ValueError, match="comes from worker group 'RankEchoActor', not 't-dp'"):
        future.get_results(dp_group)


def test_single_and_multiple_data_calls(dp_group):
    assert ray.get(dp_group.run_single_worker_single_data("echo", 1, "x")) == (1, "x")
    assert ray.get(dp_group.run_all_workers_multiple_data("echo", ["a", "b"])) == [(0, "a"), (1, "b")]
    assert ray.get(dp_group.run_all_workers_single_data("get_tag")) == ["dp", "dp"]
    with pytest.raises(ValueError, match=r"data has 3 entries \(argument 0\) but worker group 't-dp' calls 2 workers"):
        dp_group.run_all_workers_multiple_data("echo", ["a", "b", "c"])
    with pytest.raises(IndexError, match="worker_idx 2 is outside worker group 't-dp'"):
        dp_group.run_single_worker_single_data("echo", 2, "x")
    with pytest.raises(AttributeError, match=r"RankEchoActor \(worker group 't-dp'\) has no method 'train'"):
        dp_group.run_all_workers_single_data("train")


def test_nemo_rl_style_keyword_data_calls(dp_group, dp_tp_group):
    # NeMo-RL passes per-worker data as keyword arguments, nested by in_sharded_axes.
    future = dp_tp_group.run_all_workers_sharded_data(
        "echo",
        data=["p0", "p1"],
        in_sharded_axes=["data_parallel"],
        replicate_on_axes=["tensor_parallel"],
        output_is_replicated=["tensor_parallel"],
    )
    assert future.called_workers == [0, 1, 2, 3] and future.return_from_workers == [0, 2]
    assert dp_tp_group.get_all_worker_results(future_bundle=future) == [(0, "p0"), (2, "p1")]
    # tensor_parallel is a free axis here: only its coordinate-0 ranks are called, dummies get None.
    future = dp_tp_group.run_all_workers_sharded_data(
        "echo", data=["p0", "p1"], in_sharded_axes=["data_parallel"], make_dummy_calls_to_free_axes=True
    )
    assert future.called_workers == [0, 1, 2, 3] and future.return_from_workers == [0, 2]
    assert ray.get(future.futures) == [(0, "p0"), (1, None), (2, "p1"), (3, None)]
    assert ray.get(dp_group.run_all_workers_multiple_data("echo", data=[[1], [2]], scale=[2, 3])) == [
        (0, [2]),
        (1, [6]),
    ]
    assert ray.get(dp_group.run_all_workers_multiple_data("echo", data=[[1], [2]], common_kwargs={"scale": 5})) == [
        (0, [5]),
        (1, [10]),
    ]
    refs = dp_tp_group.run_all_workers_single_data("echo", data="x", run_rank_0_only_axes=["tensor_parallel"])
    assert ray.get(refs) == [(0, "x"), (2, "x")]
    refs = dp_tp_group.run_all_workers_multiple_data("echo", data=["a", "b"], run_rank_0_only_axes=["tensor_parallel"])
    assert ray.get(refs) == [(0, "a"), (2, "b")]
    assert ray.get(dp_group.run_single_worker_single_data("echo", worker_idx=1, data="y")) == (1, "y")
    assert dp_tp_group.dp_size == 2 and dp_tp_group.dp_leader_worker_indices == [0, 2]
    assert dp_tp_group.get_dp_leader_worker_idx(1) == 2
    with pytest.raises(IndexError, match="dp_shard_idx 2 is outside"):
        dp_tp_group.get_dp_leader_worker_idx(2)
    with pytest.raises(
        ValueError, match=r"data has 1 entries \(keyword 'scale'\) but worker group 't-dp' calls 2 workers"
    ):
        dp_group.run_all_workers_multiple_data("echo", data=["a", "b"], scale=[2])
    with pytest.raises(ValueError, match="data has 3 pieces but axis 'data_parallel' has size 2"):
        dp_group.run_all_workers_sharded_data("echo", data=["a", "b", "c"], in_sharded_axes=["data_parallel"])


def test_multi_worker_future_nemo_rl_fields(dp_group):
    refs = dp_group.run_all_workers_single_data("echo", "z")
    future = MultiWorkerFuture(futures=refs, return_from_workers=[1], called_workers=[0, 1])
    assert future.get_results(dp_group) == [(1, "z")]  # made outside the group: no group name to check
    assert MultiWorkerFuture(refs, return_from_workers=[1]).get_results() == [(1, "z")]
    assert MultiWorkerFuture(refs).get_results(return_generators_as_proxies=True) == refs
    # Generator methods: drained flat in rank order, or handed back unconsumed as proxies.
    future = MultiWorkerFuture(dp_group.run_all_workers_single_data("count_up", 2))
    assert dp_group.get_all_worker_results(future) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    future = MultiWorkerFuture(dp_group.run_all_workers_single_data("count_up", 3), return_from_workers=[1])
    (proxy,) = dp_group.get_all_worker_results(future, return_generators_as_proxies=True)
    assert isinstance(proxy, ray.ObjectRefGenerator)
    assert [ray.get(ref) for ref in proxy] == [(1, 0), (1, 1), (1, 2)]


def test_env_vars_may_not_override_distributed_variables(dp_group):
    with pytest.raises(ValueError, match=r"env_vars may not set \['MASTER_PORT', 'RANK'\]"):
        RayWorkerGroup(dp_group.cluster, RayWorkerBuilder(ECHO), env_vars={"RANK": "3", "MASTER_PORT": "1"})


def test_colocated_groups_share_bundles_and_select_slots(ray_local):
    # Two groups of two workers each on two 1-CPU bundles: each actor takes half a bundle.
    cluster = RayVirtualCluster([1, 1], use_gpus=False, max_colocated_worker_groups=2)
    try:
        per_node = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), workers_per_node=1)
        explicit = RayWorkerGroup(
            cluster, RayWorkerBuilder(ECHO), bundle_indices_list=[(1, [0]), (0, [0])], dp_leader_worker_indices=[1]
        )
        assert explicit.dp_size == 1 and explicit.get_dp_leader_worker_idx(0) == 1
        assert per_node.dp_size == 2 and per_node.dp_leader_worker_indices == [0, 1]
        keys = ["RANK", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE"]
        assert [list(e.values()) for e in ray.get(per_node.run_all_workers_single_data("get_env", keys))] == [
            ["0", "0", "0", "2"],
            ["1", "1", "0", "2"],
        ]
        # Ranks follow the listed order; node ranks are numbered densely from rank 0's node.
        assert [(m.rank, m.placement_group_index, m.node_rank) for m in explicit.worker_metadata] == [
            (0, 1, 0),
            (1, 0, 1),
        ]
        assert [e["NODE_RANK"] for e in ray.get(explicit.run_all_workers_single_data("get_env", keys))] == ["0", "1"]
        # A missing cleanup method is reported (False) and the workers are killed all the same.
        per_node_workers = per_node.workers
        assert per_node.shutdown(cleanup_method="no_such_method") is False
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(per_node_workers[1].get_tag.remote())
        explicit.shutdown()
        with pytest.raises(
            ValueError, match="bundle_indices_list names placement group 1, bundle 1, which the cluster"
        ):
            RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), bundle_indices_list=[(1, [1])])
        with pytest.raises(ValueError, match="workers_per_node asks for 2 workers on node 0, which has 1 bundles"):
            RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), workers_per_node=2)
        with pytest.raises(
            ValueError, match=r"must hold every rank 0..1 of worker group 'RankEchoActor' \(2 workers\) exactly once"
        ):
            RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), sharding_annotations=NamedSharding(np.arange(4), ["dp"]))
        with pytest.raises(ValueError, match=r"dp_leader_worker_indices must be distinct ascending ranks in 0..1"):
            RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), dp_leader_worker_indices=[1, 0])
        with pytest.raises(ValueError, match=r"got ranks \[0, 5\]"):
            RayWorkerGroup(cluster, RayWorkerBuilder(ECHO), sharding_annotations=NamedSharding([0, 5], ["dp"]))
    finally:
        cluster.shutdown()


def test_failures_surface_with_the_failing_rank(ray_local, tmp_path):
    cluster = RayVirtualCluster([2], use_gpus=False)
    try:
        with pytest.raises(RuntimeError, match="an actor failed to start") as excinfo:
            RayWorkerGroup(cluster, RayWorkerBuilder(f"{MODULE}.FailingInitActor"), name_prefix="t-init")
        assert "constructor of rank 1 failed on purpose" in str(excinfo.value.__cause__)

        group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO, marker_dir=str(tmp_path)), name_prefix="t-fail")
        # Rank 1 fails while rank 0 blocks (as in a collective missing its peer): the error must still come out.
        future = group.run_all_workers_sharded_data("fail_on_rank", [1, 1], in_sharded_axes=["data_parallel"])
        with pytest.raises(ValueError, match="rank 1 failed on purpose") as excinfo:
            future.get_results(group)
        assert "raised by worker rank 1 in t-fail.fail_on_rank" in excinfo.value.__notes__
        # Rank 0 is still busy, so its cleanup cannot finish in time; the workers are killed anyway.
        assert group.shutdown(cleanup_method="cleanup", timeout=2.0) is False
        assert not (tmp_path / "cleanup-0").exists()
    finally:
        cluster.shutdown()


def test_a_rendezvous_port_taken_meanwhile_starts_the_group_again(ray_local, tmp_path, caplog):
    cluster = RayVirtualCluster([2], use_gpus=False)
    try:
        group = RayWorkerGroup(cluster, RayWorkerBuilder(f"{MODULE}.PortTakenOnceActor", str(tmp_path)))
        taken = int((tmp_path / "taken").read_text())
        assert group.master_port != taken
        assert ray.get(group.run_all_workers_single_data("world_size")) == [2, 2]
        assert f"rendezvous port {taken} was taken before rank 0 could listen on it" in caplog.text
        group.shutdown()
    finally:
        cluster.shutdown()


def test_shutdown_runs_cleanup_then_kills_workers(ray_local, tmp_path):
    cluster = RayVirtualCluster([2], use_gpus=False, collective_timeout_s=90.0)
    try:
        group = RayWorkerGroup(cluster, RayWorkerBuilder(ECHO, tag="bye", marker_dir=str(tmp_path)))
        # the cluster's collective timeout (watchdog.collective_timeout_s) reaches every worker
        assert (
            ray.get(group.run_all_workers_single_data("get_env", [COLLECTIVE_TIMEOUT_ENV]))
            == [{COLLECTIVE_TIMEOUT_ENV: "90.0"}] * 2
        )
        workers = group.workers
        assert group.shutdown(cleanup_method="cleanup") is True
        assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"cleanup-0": "bye", "cleanup-1": "bye"}
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(workers[0].get_tag.remote())
        with pytest.raises(RuntimeError, match="worker group 'RankEchoActor' was shut down"):
            group.run_all_workers_single_data("get_tag")
        assert group.shutdown(cleanup_method="cleanup") is True  # idempotent: nothing left to clean
    finally:
        cluster.shutdown()


# ---- worker Python environments -------------------------------------------------------------------------------


def _make_venv_seeing_project_packages(venv_dir: Path) -> Path:
    """A real venv whose site-packages pulls in this project's environment (so it can import ray)."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(venv_dir)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    project_site = sysconfig.get_paths()["purelib"]
    # `import` lines of a .pth run at start-up; addsitedir also processes the project's own .pth files.
    (venv_dir / "lib" / version / "site-packages" / "project.pth").write_text(
        f"import site; site.addsitedir({project_site!r})\n"
    )
    return venv_dir / "bin" / "python"


def test_unregistered_actor_classes_use_the_driver_interpreter(dp_group):
    assert ray.get(dp_group.run_single_worker_single_data("get_python", 0)) == (sys.executable, sys.prefix)


def test_registered_python_executable_runs_the_actor(ray_local, tmp_path):
    python = _make_venv_seeing_project_packages(tmp_path / "probe-venv")
    fqn = f"{MODULE}.VenvProbeActor"
    register_actor_environment(fqn, str(python))
    cluster = RayVirtualCluster([1], use_gpus=False)
    try:
        group = RayWorkerGroup(cluster, RayWorkerBuilder(fqn))
        executable, prefix = ray.get(group.run_single_worker_single_data("get_python", 0))
        assert executable == str(python)
        assert prefix == str(tmp_path / "probe-venv") != sys.prefix
        group.shutdown()
    finally:
        unregister_actor_environment(fqn)
        cluster.shutdown()


def test_actor_environment_registry_lookup():
    fqn = f"{MODULE}.NotRegistered"
    assert sys.executable == PY_EXECUTABLES.SYSTEM
    assert get_actor_python_executable(fqn) == sys.executable
    register_actor_environment(fqn, "/nonexistent/bin/python")
    try:
        with pytest.raises(FileNotFoundError, match=f"'/nonexistent/bin/python' registered for actor class {fqn}"):
            get_actor_python_executable(fqn)
    finally:
        unregister_actor_environment(fqn)
    with pytest.raises(TypeError, match="must be a path or UvEnvironment"):
        register_actor_environment(fqn, ["python"])
    with pytest.raises(ValueError, match="plain directory name"):
        UvEnvironment("../escape")


def test_uv_sync_command_and_environ(monkeypatch, tmp_path):
    command = uv_sync_command(PY_EXECUTABLES.MCORE, repo_root=tmp_path)
    assert Path(command[0]).name == "uv"
    assert command[1:] == [
        "sync",
        "--locked",
        "--no-default-groups",
        "--project",
        str(tmp_path),
        "--python",
        sys.executable,
        "--group",
        "mcore",
    ]
    monkeypatch.setenv("VIRTUAL_ENV", "/some/active/venv")
    environ = uv_sync_environ(tmp_path / "venvs" / "mcore")
    assert environ["UV_PROJECT_ENVIRONMENT"] == str(tmp_path / "venvs" / "mcore")
    assert "VIRTUAL_ENV" not in environ


@pytest.fixture
def tiny_uv_project(tmp_path: Path) -> Path:
    """A real uv project with no dependencies, locked offline: building its environment takes ~0.1 s."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "probe"\nversion = "0.0.0"\nrequires-python = ">=3.11"\ndependencies = []\n\n'
        "[dependency-groups]\nprobe = []\n\n[tool.uv]\npackage = false\n"
    )
    subprocess.run(["uv", "lock", "--offline", "--project", str(tmp_path)], check=True, capture_output=True)
    return tmp_path


def test_uv_environment_is_built_once_then_reused(tiny_uv_project, monkeypatch):
    monkeypatch.delenv(FORCE_REBUILD_ENV_VAR, raising=False)
    env = UvEnvironment("probe-env", ("probe",))
    python = ensure_uv_environment(env, repo_root=tiny_uv_project)
    assert python == tiny_uv_project / "venvs" / "probe-env" / "bin" / "python"
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == str(tiny_uv_project / "venvs" / "probe-env")
    keepsake = python.parent.parent / "keepsake"
    keepsake.write_text("reused")
    assert ensure_uv_environment(env, repo_root=tiny_uv_project) == python
    assert keepsake.read_text() == "reused"


def test_force_rebuild_deletes_and_rebuilds_once_per_process(tiny_uv_project, monkeypatch):
    monkeypatch.delenv(FORCE_REBUILD_ENV_VAR, raising=False)
    env = UvEnvironment("probe-env", ("probe",))
    python = ensure_uv_environment(env, repo_root=tiny_uv_project)
    keepsake = python.parent.parent / "keepsake"
    keepsake.write_text("old build")
    monkeypatch.setenv(FORCE_REBUILD_ENV_VAR, "true")
    assert ensure_uv_environment(env, repo_root=tiny_uv_project) == python
    assert python.exists() and not keepsake.exists()  # rebuilt from scratch
    keepsake.write_text("fresh build")
    ensure_uv_environment(env, repo_root=tiny_uv_project)  # same process: the fresh build is reused
    assert keepsake.read_text() == "fresh build"


def test_failed_uv_build_reports_uv_error_and_is_not_reused(tiny_uv_project):
    env = UvEnvironment("broken", ("no-such-group",))
    for _ in range(2):  # the partial environment uv left behind must not count as built
        with pytest.raises(RuntimeError, match=r"(?s)building uv environment 'broken'.*no-such-group"):
            ensure_uv_environment(env, repo_root=tiny_uv_project)


def test_uv_environment_needs_a_source_checkout(tmp_path):
    with pytest.raises(RuntimeError, match="needs the project's source checkout"):
        ensure_uv_environment(PY_EXECUTABLES.VLLM, repo_root=tmp_path)
