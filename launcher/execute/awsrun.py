"""`launch train` (and friends) on a deployed stack: discover -> wait until ready -> storage -> data -> run,
with the stack deleted in a finally block when asked (also on failure and Ctrl-C).

Only sequencing lives here; decisions are in launcher.cluster.aws (discover, readiness) and launcher.plans (storage,
staging, job), and AWS calls in launcher.cluster.aws.api. Every step that touches a node goes through
launcher.execute.remote, as on the local cluster.
"""

from __future__ import annotations

import concurrent.futures
import json
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import boto3

from ami import paths
from launcher.cluster import Cluster, Node
from launcher.cluster.aws import api as aws
from launcher.cluster.aws import readiness
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.execute.dataprep import convert_on_cluster
from launcher.plans import staging, storage
from launcher.plans.dataprep import ConvertSpec

T = TypeVar("T")

__all__ = ["as_slurm_job", "check_data", "connect_ready", "install_node_access", "prepare_storage",
           "shared_root", "ssh_probe", "stage_data", "with_teardown"]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ssh_probe(c: Cluster, nodes: list[Node]) -> dict[str, tuple[bool, str, str]]:
    """readiness.PROBE on these nodes at once: node -> (answered, output, error)."""
    return {r.node: (r.exit_code >= 0, r.stdout, r.error) for r in remote.run_all(c, nodes, readiness.PROBE)}


def show_progress(verdicts: list[readiness.Verdict]) -> None:
    say("waiting: " + ", ".join(f"{v.node} {v.detail}" for v in verdicts))


def connect_ready(sess: boto3.Session, stack: str, *, profile: str | None = None,
                  timeout_s: float = 1800, interval_s: float = 15, console: Callable[[str], list[str]] | None = None,
                  probe: aws.Probe | None = None,
                  agent: Callable[[list[str]], set[str]] | None = None, clock=None, sleep=None,
                  on_progress: Callable[[list[readiness.Verdict]], None] | None = show_progress) -> Cluster:
    """Discover the stack and wait until every node (and the head node) is ready; on the way, let the launcher's key
    in over SSM on each as soon as its agent answers (a node discovered later, such as an Auto Scaling group's
    replacement, too)."""
    console = console or aws.ConsoleReader(sess, say=say)  # one reader: a Xen console's note is said once
    c = aws.discover_cluster(sess, stack, profile=profile, console=console)
    state = {"cluster": c}
    timing = {k: v for k, v in (("clock", clock), ("sleep", sleep)) if v is not None}

    def gather() -> list[readiness.NodeFacts]:
        cur = state["cluster"]
        unpinned = [n for n in cur.machines if n.name not in _pinned(cur)]
        if unpinned:  # host keys appear on the console late in the first boot: discover again to pin them
            cur = state["cluster"] = aws.discover_cluster(sess, stack, profile=profile, console=console)
        online = (agent or (lambda ids: aws.ssm_online(sess, ids)))([n.instance_id for n in cur.machines
                                                                     if n.instance_id])
        done = aws.install_keys(sess, cur, online=online, **timing)
        if done:
            say(f"the launcher's key is on {', '.join(done)} (SSM)")
        return aws.gather_facts(sess, cur, probe=probe or ssh_probe, agent=lambda ids: online)

    readiness.wait_ready(gather, readiness.expected_devices(c), timeout_s=timeout_s, interval_s=interval_s,
                         on_progress=on_progress, clock=clock or time.monotonic, sleep=sleep or time.sleep)
    return state["cluster"]


def _pinned(c: Cluster) -> set[str]:
    text = Path(c.known_hosts).read_text() if Path(c.known_hosts).is_file() else ""
    reach = {n.instance_id: n.name for n in c.machines if n.instance_id}
    return {reach[line.split(" ", 1)[0].split(",")[0]] for line in text.splitlines()
            if line.split(" ", 1)[0].split(",")[0] in reach}


def with_teardown(sess: boto3.Session, stack: str, teardown: bool, body: Callable[[], T], *,
                  instead: Callable[[], str | None] = lambda: None) -> T:
    """``body()``, then, when ``teardown``, delete the stack even if body failed or was interrupted (Ctrl-C).

    ``instead``, asked after body: None to delete the stack here; else the cluster ends it itself (a Slurm job's
    epilog, see :func:`as_slurm_job`) and the line to say so ("": said already). A teardown failure after the body
    failed is reported as a warning line; the body's error stays the verdict.
    """
    failed = False
    try:
        return body()
    except BaseException:
        failed = True
        raise
    finally:
        line = instead() if teardown else None
        if line:
            say(line)
        if teardown and line is None:
            try:
                aws.teardown(sess, stack, say=say)
            except LaunchError as e:
                if not failed:
                    raise
                say(f"warning: --teardown: {e}")


def as_slurm_job(c: Cluster, output: str, run: Callable[[], None], handover: dict[str, str | None]) -> None:
    """``run()``, the run as a Slurm job on the head node (`launch train`'s _on_slurm: submit, follow, report), and in
    ``handover["line"]`` who ends the stack after --teardown (for :func:`with_teardown`'s ``instead``): once a job for
    ``output`` was submitted, its epilog does (the launcher leaves the stack, even when it stopped following: the job
    is the cluster's); before that, the launcher (None). The head node is asked which jobs it has before and, when
    ``run`` fails, after."""
    from launcher.cluster.aws import lifecycle
    from launcher.execute import slurmjobs

    before = {j.id for j in slurmjobs.jobs(c)}  # also shows Slurm's controller answers before anything is submitted
    try:
        run()
    except BaseException:
        try:
            job = lifecycle.new_job(before, [(j.id, j.output) for j in slurmjobs.jobs(c)], output)
        except Exception as e:  # whatever asking raised, the run's own error stays the verdict
            handover["line"] = lifecycle.teardown_unknown(c.name, str(e).splitlines()[0] if str(e) else repr(e))
        else:
            handover["line"] = lifecycle.teardown_left_to_job(c.name, job) if job else None
        raise
    handover["line"] = ""  # the job ended and its epilog took the stack down; _on_slurm said so


def _on_nodes(c: Cluster, scripts: dict[str, str], what: str, *, sudo: bool) -> None:
    """One script per node, the nodes in parallel; any failure is one line naming the nodes."""
    def one(node: Node, script: str) -> tuple[str, int, str]:
        cmd = f"{'sudo ' if sudo else ''}bash -c {shlex.quote(script)}"
        code, out, err = remote.check_output(c, node, cmd)
        return node.name, code, staging.cli_error(err, out)

    by_name = {n.name: n for n in c.machines}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, max(1, len(scripts)))) as pool:
        done = list(pool.map(lambda item: one(by_name[item[0]], item[1]), scripts.items()))
    # With the failing command's own last line (the AWS CLI's "An error occurred (AccessDenied) ..."), not only
    # its exit code: the reason is on the node, and the launcher is the only one reading it.
    failed = [f"{name} (exit {code}{': ' + why if why else ''})" for name, code, why in done if code != 0]
    if failed:
        raise LaunchError(f"{what} failed on {', '.join(failed)}")


def install_node_access(c: Cluster) -> None:
    """Put the nodes' key, ssh_config and known_hosts on every node (SFTP, mode 0600), so mpirun on node0 reaches
    the others. (AWS nodes and rehearsal nodes alike.)"""
    d = Path(c.ssh_config).parent
    target = str(Path(c.mpi_ssh_config).parent)
    sources = {"id_ed25519": d / "node_ed25519", "ssh_config": d / "node_ssh_config",
               "known_hosts": d / "node_known_hosts"}
    missing = [str(p) for p in sources.values() if not p.is_file()]
    if missing:
        raise LaunchError(f"missing {', '.join(missing)}; discover the cluster again (`launch discover`)")
    files = {name: path.read_text() for name, path in sources.items()}
    _on_nodes(c, {n.name: f"install -d -m 700 {shlex.quote(target)}" for n in c.nodes},
              "creating the cluster's ssh directory", sudo=False)

    def one(node: Node) -> None:
        # Written aside, then renamed: a reader never sees half a file, and nodes sharing a home do not collide.
        for name, text in files.items():
            remote.put_text(c, node, text, f"{target}/.{name}.{node.name}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(c.nodes))) as pool:
        list(pool.map(one, c.nodes))
    _on_nodes(c, {n.name: " && ".join(f"mv -f {shlex.quote(f'{target}/.{name}.{n.name}')} "
                                      f"{shlex.quote(f'{target}/{name}')}" for name in files) for n in c.nodes},
              "installing the cluster's ssh files", sudo=False)


def prepare_storage(c: Cluster) -> None:
    """BeeGFS or FSx set-up, phase by phase (a no-op with storage 'none'); then the head node's mount, once the
    servers are up.

    FSx is mounted already by every instance's own boot (its user data's /etc/fstab line, before Slurm's daemons
    start), an Auto Scaling replacement's too; the FSx plan here (``mountpoint -q || mount``) is then redundant but
    harmless, and still mounts it on a stack deployed before the boots did. BeeGFS needs it: the launcher makes it."""
    assert c.aws is not None
    secret_file = Path(c.ssh_config).parent / "beegfs-secret"
    if not secret_file.is_file():
        secret_file.write_text(secrets.token_hex(32))
        secret_file.chmod(0o600)
    secret = secret_file.read_text()
    phases = storage.storage_plan(c.aws.storage, c.workers, c.reducers, secret=secret)
    for phase in [*phases, *storage.head_storage_plan(c, secret=secret)]:
        say(f"storage: {phase.name} on {', '.join(phase.scripts)}")
        _on_nodes(c, phase.scripts, f"storage set-up ({phase.name})", sudo=True)


def shared_root(c: Cluster) -> str | None:
    """Where runs and staged data live on every node: the shared mount's scaletrain directory, or None."""
    return c.shared_root


def check_data(sess: boto3.Session, stack: str, data: str | None) -> None:
    """Before anything starts: an ``s3://`` ``--data`` must be in the bucket the stack's nodes may read (its
    DataBucket output); else one line naming that bucket (staging.check_source)."""
    if data and data.startswith("s3://"):
        outputs = aws.stack_outputs(sess, stack)
        staging.check_source(data, outputs.data_bucket, f"stack '{stack}'")


def stage_data(c: Cluster, nodes: list[Node], data: str, *, shard_size: int = 1000,
               aws_cli: str = paths.AWS_CLI) -> str:
    """Put ``--data`` where the ranks read it; the shards directory as the nodes see it.

    ImageNet as downloaded (no manifest.json) is converted on every node of the cluster into shards of
    ``shard_size`` samples on the shared storage; a later call finds them there and converts nothing.
    ``aws_cli``: the AWS CLI's absolute path on the nodes, the image's (tests point it at a local S3 endpoint); its
    S3 commands go to the stack's region (staging.s3_manifest_command says why).
    """
    assert c.aws is not None
    first = nodes[0]
    root = shared_root(c) or first.workdir
    found = {}
    if not data.startswith("s3://"):
        script = staging.probe_script(staging.probe_paths(data, shared_root=root))
        code, text = remote.check(c, first, script)
        if code != 0:
            raise LaunchError(f"looking at --data {data} on {first.name} failed (exit {code})")
        found = staging.parse_probe(text)
    plan = staging.decide(data, storage=c.aws.storage, data_bucket=c.aws.data_bucket, shared_root=root,
                          found=found, node=first.name)
    if plan.kind == "ready":
        if plan.dest != plan.source:
            say(f"using {plan.dest}, converted from {plan.source} by an earlier run")
        return plan.dest
    if plan.kind == "convert":
        say(f"converting {plan.source} to shards in {plan.dest} on {len(c.nodes)} node(s)")
        convert_on_cluster(c, ConvertSpec(src=plan.source, out=plan.dest, shard_size=shard_size))
        return plan.dest
    code, text, err = remote.check_output(c, first, staging.s3_manifest_command(plan.source, aws_cli=aws_cli,
                                                                                region=c.aws.region))
    if code != 0:
        raise LaunchError(staging.s3_read_failure(plan.source, first.name, staging.cli_error(err, text)))
    shards = [s["name"] for s in json.loads(text)["shards"]]
    scripts = staging.s3_copy_scripts(plan, shards, [n.name for n in nodes], shared=shared_root(c) is not None,
                                      aws_cli=aws_cli, region=c.aws.region)
    say(f"staging {len(shards)} shard(s) from {plan.source} to {plan.dest} on {len(nodes)} node(s)")
    _on_nodes(c, scripts, "staging the data", sudo=False)
    return plan.dest
