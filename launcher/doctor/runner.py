"""The shell of `launch doctor`: gather every node's probes in parallel, then the cluster-wide test.

Decisions live in launcher/doctor/checks.py; this module only runs commands (launcher.execute.remote) and feeds
the output in.
"""

from __future__ import annotations

import shlex
import time

from ami import paths
from infra import catalog
from launcher.cluster import Cluster, Node
from launcher.doctor import checks as doctor
from launcher.doctor.checks import Check
from launcher.doctor.gpuarch import check_torch_arch
from launcher.doctor.ncclnet import DEBUG_ENV, check_nccl_net
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans import efa, job

NCCL_TESTS = f"{paths.NCCL_TESTS}/all_reduce_perf"


def _clock(cluster: Cluster, nodes: list[Node]) -> dict[str, Check]:
    sent = time.time()
    results = remote.run_all(cluster, nodes, "date +%s.%N")
    received = time.time()
    return {r.node: doctor.check_clock(r.stdout, sent, received) if r.ok else
            doctor.fail("clock", f"date failed: {r.error or r.stderr.strip()}") for r in results}


def mpi_hello_argv(cluster: Cluster, nodes: list[Node], hostfile_path: str) -> list[str]:
    """One rank per node printing its node's name, over the same ssh_config and MCA settings as training."""
    argv = job.mpirun_head(cluster)
    argv += ["-np", str(len(nodes)), "--hostfile", hostfile_path, "--map-by", "node",
             "--mca", "plm_rsh_agent", f"ssh -F {cluster.mpi_ssh_config}", "--mca", "pml", "ob1",
             "--mca", "btl", "^openib"]
    if cluster.mpi_interface:
        argv += ["--mca", "btl_tcp_if_include", cluster.mpi_interface, "--mca", "oob_tcp_if_include",
                 cluster.mpi_interface]
    # A rehearsal node, like an EC2 instance, has its own hostname and no SCALETRAIN_NODE (only the loopback sshd
    # sets it, its nodes sharing this machine's hostname): each rank names its node by whichever it has.
    return argv + ["sh", "-c", 'echo "${SCALETRAIN_NODE:-$(hostname)}"']


def nccl_test_argv(cluster: Cluster, nodes: list[Node], instance: catalog.InstanceType,
                   hostfile_path: str) -> list[str]:
    """nccl-tests' all_reduce_perf, one rank per GPU on every node, with the EFA environment of launcher.plans.efa (none
    where the workers' node group is on TCP), and NCCL's INIT and NET INFO lines, which name the net plugin it loaded
    (launcher/doctor/ncclnet.py)."""
    ranks = sum(n.slots for n in nodes)
    argv = job.mpirun_head(cluster)
    argv += ["-np", str(ranks), "--hostfile", hostfile_path, "--bind-to", "none", "--map-by", "slot",
             "--mca", "plm_rsh_agent", f"ssh -F {cluster.mpi_ssh_config}"]
    fabric, mca = efa.for_cluster(cluster)
    for key, value in mca:
        argv += ["--mca", key, value]
    env = fabric | DEBUG_ENV | {"LD_LIBRARY_PATH": ":".join(paths.LIB_PATH)}
    for key, value in sorted(env.items()):
        argv += ["-x", f"{key}={value}"]
    return argv + [NCCL_TESTS, "-b", "8", "-e", "2G", "-f", "2", "-g", "1"]


def _across_nodes(cluster: Cluster, nodes: list[Node], argv_for) -> tuple[int, str]:
    first = nodes[0]
    hostfile_path = f"{first.workdir}/doctor-hostfile"
    code, _ = remote.check(cluster, first, f"printf %s {shlex.quote(job.hostfile(nodes))} > "
                                           f"{shlex.quote(hostfile_path)}")
    if code != 0:
        return code, f"could not write {hostfile_path}"
    return remote.check(cluster, first, job.command_line(argv_for(hostfile_path)) + " 2>&1")


def diagnose(cluster: Cluster, *, storage: str = "auto") -> list[Check]:
    """Every check on every node (gathered in parallel), then the test across the worker nodes."""
    if storage not in doctor.STORAGE_CHOICES:
        raise LaunchError(f"--storage must be one of: {', '.join(doctor.STORAGE_CHOICES)}; got '{storage}'")
    instance = None
    if cluster.backend == "aws":
        if not cluster.instance_type:
            raise LaunchError(f"cluster '{cluster.name}' records no instance type; rediscover it")
        instance = catalog.get(cluster.instance_type)
    shared = cluster.rehearsal.shared_mount if cluster.rehearsal else None
    results = remote.run_all(cluster, cluster.nodes, doctor.probe_script(cluster.backend, cluster.python,
                                                                          cluster.mpirun, shared_mount=shared))
    clocks = _clock(cluster, cluster.nodes)
    checks: list[Check] = []
    reachable = []
    for node, result in zip(cluster.nodes, results, strict=True):
        if result.exit_code == -1:
            checks.append(Check("ssh", "fail", f"unreachable: {result.error}", node.name))
            continue
        reachable.append(node)
        probes = doctor.parse_probes(result.stdout)
        if instance is not None and node.role == "worker":
            found = doctor.evaluate_aws(probes, instance, storage=storage,
                                        efa_devices=node.efa_devices if node.transport == "efa" else 0)
            # torch's kernels for the catalog's GPU of this type (not in evaluate_aws: the health check skips it)
            found.append(check_torch_arch(probes.get("torch-arch", doctor.Probe("probe did not run", 127)),
                                          [instance.compute_capability] if instance.compute_capability else [],
                                          what=f"{instance.name}'s {instance.gpu_model}"))
        elif instance is not None:  # a reducer: CPU only, what training needs from it is MPI and the storage
            found = [doctor.check_mpirun(probes.get("mpirun", doctor.Probe("", 127))),
                     doctor.check_storage(probes.get("storage", doctor.Probe("", 1)),
                                          probes.get("storage-write", doctor.Probe("", 1)), storage)]
        else:
            found = doctor.evaluate_local(probes, cluster.python, shared_mount=shared)
        checks += doctor.on_node(found + [clocks[node.name]], node.name)

    workers = [n for n in cluster.workers if n in reachable]
    across = "all nodes"
    if len(workers) < 2 or len(workers) != len(cluster.workers):
        why = "needs 2 reachable worker nodes" if len(workers) < 2 else "a worker node is unreachable"
        checks.append(Check("nccl allreduce" if instance else "mpirun across nodes", "skip", why, across))
    elif instance is None:
        code, out = _across_nodes(cluster, workers, lambda h: mpi_hello_argv(cluster, workers, h))
        checks.append(doctor.on_node([doctor.check_mpi_hello(code, out, [n.name for n in workers])], across)[0])
        checks.append(Check("nccl allreduce", "skip", dict(doctor.LOCAL_SKIPPED)["nccl allreduce"], across))
    elif instance.gpus == 0:
        checks.append(Check("nccl allreduce", "skip", f"{instance.name} has no GPUs", across))
    else:
        code, out = _across_nodes(cluster, workers, lambda h: nccl_test_argv(cluster, workers, instance, h))
        checks.append(doctor.on_node([doctor.check_bus_bandwidth(code, out, instance, len(workers))], across)[0])
        # Which aws-ofi-nccl NCCL loaded, against the one the image pins (its scaletrain:aws-ofi-nccl tag).
        pinned = efa.versions_of(cluster.aws.software).aws_ofi_nccl if cluster.aws else None
        checks.append(doctor.on_node([check_nccl_net(out, instance, pinned=pinned,
                                                     efa_devices=None if efa.uses_efa(cluster) else 0)], across)[0])
    return checks
