"""Pure plans against golden files: hostfile, mpirun argv, ssh_config, sshd_config, known_hosts."""

from __future__ import annotations

import json

import pytest
from golden import assert_golden

from ami import paths
from infra.catalog import get
from launcher import render
from launcher.cluster import Cluster, Node
from launcher.doctor import runner as doctor_run
from launcher.errors import LaunchError
from launcher.local.backend import cpus_per_node, node_names
from launcher.plans import job as plan
from launcher.plans import offline


def local_cluster(n: int, user: str = "root", reducers: int = 0) -> Cluster:
    roles = node_names(n, reducers)
    cpus = cpus_per_node(16, len(roles))
    nodes = [Node(name=name, address="127.0.0.1", port=42000 + i, role=role, slots=1, cpus=cpus,
                  workdir=f"/state/clusters/local/nodes/{name}/work") for i, (name, role) in enumerate(roles)]
    return Cluster(name="local", backend="local", nodes=nodes, user=user,
                   ssh_config="/state/clusters/local/ssh_config", known_hosts="/state/clusters/local/known_hosts",
                   python="/state/venv/bin/python", mpirun="/usr/bin/mpirun", mpi_interface="lo")


SPEC = plan.TrainSpec(data="/data/shards", output="/runs/r1", model="resnet18", image_size=32, epochs=3,
                      batch_per_gpu=32, warmup_epochs=1, workers=1)


@pytest.mark.parametrize("n", [1, 2, 16])
def test_hostfile(n):
    c = local_cluster(n)
    assert_golden(f"hostfile-local-{n}.txt", plan.hostfile(c.select_workers(n)))


@pytest.mark.parametrize("n", [1, 2, 16])
def test_mpirun_argv(n):
    c = local_cluster(n)
    argv = plan.mpirun_argv(c, c.select_workers(n), SPEC, "/runs/r1/hostfile")
    assert_golden(f"mpirun-local-{n}.json", json.dumps(argv, indent=1) + "\n")
    assert argv[argv.index("-np") + 1] == str(n)


def test_mpirun_as_ordinary_user_has_no_root_flag():
    c = local_cluster(2, user="ubuntu")
    argv = plan.mpirun_argv(c, c.workers, SPEC, "/runs/r1/hostfile")
    assert "--allow-run-as-root" not in argv
    assert "--allow-run-as-root" in plan.mpirun_argv(local_cluster(2), c.workers, SPEC, "/h")


def test_threads_share_the_machine():
    # 16 cores over 16 local nodes: one thread per rank; over 2 nodes: 8.
    assert plan.rank_env(local_cluster(16), local_cluster(16).workers)["OMP_NUM_THREADS"] == "1"
    assert plan.rank_env(local_cluster(2), local_cluster(2).workers)["OMP_NUM_THREADS"] == "8"


def test_ddp_engine_gets_its_rendezvous_and_horovod_runs_unchanged():
    c = local_cluster(2)
    ddp = plan.mpirun_argv(c, c.workers, SPEC.model_copy(update={"engine": "ddp"}), "/runs/r1/hostfile")
    assert ddp[ddp.index("MASTER_ADDR=127.0.0.1") - 1:][:2] == ["-x", "MASTER_ADDR=127.0.0.1"]
    assert f"MASTER_PORT={plan.DDP_PORT}" in ddp and ddp[-2:] == ["--engine", "ddp"]
    hvd = plan.mpirun_argv(c, c.workers, SPEC, "/runs/r1/hostfile")
    assert "--engine" not in hvd and not any(a.startswith("MASTER_") for a in hvd)


def test_resume_and_extra_args_reach_the_trainer():
    spec = SPEC.model_copy(update={"resume": True, "extra_args": ("--seed", "3")})
    argv = plan.trainer_argv("python", spec)
    assert argv[-3:] == ["--resume", "--seed", "3"]


def test_select_workers_bounds():
    c = local_cluster(2, reducers=1)
    assert [n.name for n in c.select_workers(None)] == ["node0", "node1"]
    with pytest.raises(LaunchError, match=r"--nodes 3 is more than the 2 worker node\(s\)"):
        c.select_workers(3)
    with pytest.raises(LaunchError, match="--nodes must be >= 1"):
        c.select_workers(0)


def test_ssh_config():
    text = render.ssh_config("local", [("node0", "127.0.0.1", 42000), ("node1", "127.0.0.1", 42001)],
                             user="root", identity_file="/state/id_ed25519", known_hosts="/state/known_hosts")
    assert_golden("ssh_config-local-2.txt", text)
    assert "StrictHostKeyChecking yes" in text and "StrictHostKeyChecking no" not in text


def test_sshd_config():
    text = render.sshd_config("local", "node0", port=42000, host_key="/s/hk", pid_file="/s/pid",
                              authorized_keys="/s/authorized_keys", user="root", workdir="/s/work")
    assert_golden("sshd_config-node0.txt", text)
    assert "ListenAddress 127.0.0.1" in text and "PasswordAuthentication no" in text


def test_known_hosts_uses_bracketed_port_form():
    text = render.known_hosts([("127.0.0.1", 42000, "ssh-ed25519 AAAAkey host\n"), ("10.0.0.5", 22, "ssh-ed25519 B")])
    assert text == "[127.0.0.1]:42000 ssh-ed25519 AAAAkey host\n10.0.0.5 ssh-ed25519 B\n"


# --- mpirun is never looked up on a node's PATH ----------------------------------------------------------------------


def every_mpirun_line(c: Cluster) -> list[list[str]]:
    """Every mpirun line the launcher runs on a cluster: training (alone and with the reducer tier), doctor's tests."""
    k = len(c.reducers)
    lines = [plan.mpirun_argv(c, c.workers, SPEC, "/h"), doctor_run.mpi_hello_argv(c, c.workers, "/h")]
    if k:
        lines.append(plan.mpmd_mpirun_argv(c, c.workers, c.reducers, SPEC.model_copy(
            update={"engine": "reducer", "reducers": k}), "/h"))
    if c.backend == "aws":
        lines.append(doctor_run.nccl_test_argv(c, c.workers, get(c.instance_type), "/h"))
    return lines


def test_aws_mpirun_lines_name_the_images_mpi_and_its_prefix():
    # The image puts /opt/amazon/openmpi/bin on PATH for login shells only; the launcher's SSH command is not one,
    # and the remote orted is found only through --prefix.
    c = offline.hypothetical_cluster(get("p4d.24xlarge"), 2, tier=get("c5n.18xlarge"), tier_nodes=1)
    for argv in every_mpirun_line(c):
        assert argv[:3] == [paths.MPIRUN, "--prefix", paths.MPI_PREFIX], argv[:3]
        assert "mpirun" not in argv[3:]
    assert c.python == paths.PYTHON == "/opt/scaletrain/venv/bin/python"


def test_local_mpirun_lines_name_the_clusters_mpirun_by_absolute_path():
    for argv in every_mpirun_line(local_cluster(2, reducers=1)):
        assert argv[0] == "/usr/bin/mpirun" and "--prefix" not in argv
    moved = local_cluster(2).model_copy(update={"mpirun": "/x/mpi/bin/mpirun", "mpi_prefix": "/x/mpi"})
    assert plan.mpirun_argv(moved, moved.workers, SPEC, "/h")[:3] == ["/x/mpi/bin/mpirun", "--prefix", "/x/mpi"]


def test_a_cluster_never_records_a_bare_mpirun():
    data = local_cluster(1).model_dump()
    with pytest.raises(ValueError, match="mpirun\n.*must be an absolute path"):
        Cluster.model_validate({**data, "mpirun": "mpirun"})
    # A cluster saved before the launcher recorded its MPI gets its backend's.
    old = {k: v for k, v in data.items() if k not in ("mpirun", "mpi_prefix")}
    assert Cluster.model_validate(old).mpirun == "/usr/bin/mpirun"
    aws = Cluster.model_validate({**old, "backend": "aws"})
    assert (aws.mpirun, aws.mpi_prefix) == (paths.MPIRUN, paths.MPI_PREFIX)
