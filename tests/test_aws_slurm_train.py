"""`launch train` on an AWS stack with a Slurm head node (moto, in-process): the run is a Slurm job submitted on the
head node, as on the local cluster with Slurm, and with --teardown the job's epilog ends the stack, not the launcher;
a stack without shared storage keeps today's mpirun from the launcher and says why.

The nodes' shells are a recorder (no SSH): it answers the few things the launcher reads (the shards' manifest), and
the submission is recorded rather than run, so the batch script the head node would get is what is checked.
"""

from __future__ import annotations

import json

import pytest
import test_aws_moto as moto_stack
from test_aws_moto import RECORDED, live_instances, stack_exists
from test_aws_plans import node_groups

from infra.spec import ClusterSpec
from launcher import cli
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.execute import awsrun, remote, run, slurmjobs
from launcher.plans import slurm

env = moto_stack.env  # the fixture: moto's in-process AWS
MANIFEST = json.dumps({"shards": [{"name": "train-000000.tar", "split": "train", "count": 64}]})


class Head:
    """What the head node's Slurm and the nodes' shells would do, recorded."""

    def __init__(self, *, manifest: bool = True, follow_error: str | None = None, jobs_error: str | None = None):
        self.manifest, self.follow_error, self.jobs_error = manifest, follow_error, jobs_error
        self.commands: list[tuple[str, str]] = []
        self.scripts: list[tuple[str, str]] = []
        self.jobs: list[slurm.Job] = []
        self.trained: list[str] = []

    def check(self, c, node, command, **kw):
        self.commands.append((node.name, command))
        if "manifest.json" in command:
            return (0, MANIFEST) if self.manifest else (1, "")
        return 0, ""

    def job(self, job_id: str, output: str, state: str) -> slurm.Job:
        return slurm.Job(id=job_id, name="scaletrain-resnet50", state=state, slurm_state=state.upper(), started=None,
                         ended=None, nodes="2", restarts=0, output=output, stdout=f"{output}/slurm-{job_id}.out",
                         exit_code="0:0", reason=None)

    def submit(self, c, script, output):
        self.scripts.append((output, script))
        self.jobs.append(self.job("42", output, "running"))
        return "42"

    def follow(self, c, job_id, **kw):
        if self.follow_error:
            raise LaunchError(self.follow_error)
        return self.job(job_id, self.jobs[-1].output, slurm.SUCCEEDED)

    def list_jobs(self, c, job_id=None, **kw):
        if self.jobs_error and self.scripts:
            raise LaunchError(self.jobs_error)
        return list(self.jobs)

    def train(self, c, chosen, spec, **kw):  # today's path: mpirun from the launcher
        self.trained.append(spec.output)
        raise LaunchError("training failed: mpirun on node0 exited 1")


@pytest.fixture
def head(env, monkeypatch):
    shell = Head()
    monkeypatch.setattr(aws, "ssm_online", lambda sess, ids: set(ids))
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: aws.access.host_keys_from_console(RECORDED))
    monkeypatch.setattr(aws, "install_keys", lambda sess, c, **kw: [])
    monkeypatch.setattr(awsrun, "ssh_probe", lambda c, nodes: {
        n.name: (True, f"cloud_init=done\ngpus={n.gpus}\nefa={n.efa_devices}\n", "") for n in nodes})
    monkeypatch.setattr(remote, "check", shell.check)
    monkeypatch.setattr(remote, "check_output", lambda *a, **kw: (*shell.check(*a, **kw), ""))  # + stderr
    monkeypatch.setattr(remote, "put_text", lambda *a, **kw: None)
    monkeypatch.setattr(run, "prepare_sample_data", lambda c, node, output, ranks: f"{output}/shards")
    monkeypatch.setattr(run, "train", shell.train)
    monkeypatch.setattr(slurmjobs, "submit", shell.submit)
    monkeypatch.setattr(slurmjobs, "follow", shell.follow)
    monkeypatch.setattr(slurmjobs, "jobs", shell.list_jobs)
    return shell


def deploy(**kw) -> None:
    """tests/test_aws_moto.py's stack, with the p4d worker group's EFA devices as infra's stack writes them."""
    spec = ClusterSpec(cluster_name="c1", instance_type="p4d.24xlarge", nodes=2, ami="ami-0123456789abcdef0")
    moto_stack.deploy(groups=node_groups(spec), **kw)


def train(*args: str) -> int:
    return cli.main(["train", "--cluster", "c1", "--epochs", "1", "--ready-timeout", "0", *args])


def test_train_on_a_stack_with_a_head_node_submits_a_slurm_job_and_leaves_teardown_to_it(head, capsys):
    deploy(head=True, storage="fsx")
    assert train("--teardown") == 0
    [(output, script)] = head.scripts
    assert output.startswith("/fsx/scaletrain/runs/")                          # on the shared FSx mount
    lines = script.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=8" in lines
    assert f"#SBATCH --output={output}/{slurm.OUTPUT_FILE}" in lines
    assert f"#SBATCH --comment={slurm.TEARDOWN_COMMENT}" in lines             # the epilog takes the stack down
    assert "FI_EFA_USE_HUGE_PAGE=0" in script and "/opt/amazon/openmpi/bin/mpirun" in script  # the AWS EFA run
    assert not head.trained
    # The head node mounted FSx (where `launch train` and `launch logs` read the job's output) before the submission.
    assert any(name == "head" and "mount -t lustre" in cmd for name, cmd in head.commands)
    # --teardown: the job's epilog moves the TTL to now; the launcher did not delete the stack itself.
    assert stack_exists() and len(live_instances()) == 3
    assert "the cluster takes itself down now that job 42 has ended" in capsys.readouterr().out


def test_a_failure_before_the_job_is_submitted_is_torn_down_by_the_launcher(head, capsys):
    deploy(head=True, storage="fsx")
    head.manifest = False  # the sample data's conversion left no manifest: _on_slurm stops before sbatch
    assert train("--teardown") == 1
    assert head.scripts == [] and not stack_exists() and live_instances() == []
    assert "error: no manifest.json in /fsx/scaletrain/runs/" in capsys.readouterr().err


def test_a_run_that_stops_following_its_submitted_job_leaves_the_stack_to_the_job(head, capsys):
    deploy(head=True, storage="fsx")
    head.follow_error = "no connection to head for 600 s; job 42 runs on the cluster"
    assert train("--teardown") == 1
    assert stack_exists() and len(live_instances()) == 3
    err = capsys.readouterr().err
    assert "--teardown: job 42 takes stack 'c1' down when it ends" in err
    assert err.strip().splitlines()[-1] == f"error: {head.follow_error}"


def test_when_the_head_cannot_say_whether_the_job_was_submitted_the_stack_is_left(head, capsys):
    deploy(head=True, storage="fsx")
    head.follow_error, head.jobs_error = "no connection to head for 600 s", "SSH to head timed out"
    assert train("--teardown") == 1
    assert stack_exists()
    err = capsys.readouterr().err
    assert ("warning: --teardown: could not tell whether this run's job was submitted (SSH to head timed out); not "
            "deleting stack 'c1'") in err


def test_a_stack_with_a_head_node_and_no_shared_storage_runs_mpirun_from_here_and_says_why(head, capsys):
    deploy(head=True, storage="none")
    assert train("--teardown") == 1
    assert head.scripts == [] and len(head.trained) == 1                       # today's path, not a Slurm job
    assert not head.trained[0].startswith("/fsx")                              # node0's own disk
    err = capsys.readouterr().err
    assert "has no shared storage, so this run is not a Slurm job" in err and "-c storage=fsx" in err
    assert not stack_exists()                                                  # the launcher's --teardown, as before


def test_a_stack_without_a_head_node_runs_mpirun_from_here_and_says_nothing_new(head, capsys):
    deploy(storage="beegfs")
    assert train() == 1
    assert head.scripts == [] and len(head.trained) == 1
    assert "Slurm" not in capsys.readouterr().err


def test_launch_run_on_a_stack_with_a_head_node_is_a_slurm_job_with_the_efa_environment(head, monkeypatch, tmp_path,
                                                                                        capsys):
    """`launch run` on AWS: the working directory goes to the stack's FSx, and the job's mpirun starts the user's
    command once per GPU (8 on p4d) through launcher.execute.userrank, with the run's EFA settings."""
    from launcher.execute import sync
    from launcher.plans import userjob

    sent = []
    monkeypatch.setattr(sync, "push", lambda c, node, root, shared: sent.append((node.name, shared)) or sync.Synced(
        f"{shared}/work/proj-1", userjob.sync_plan({"train.py": (1, 1)}, {})))
    deploy(head=True, storage="fsx")
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert cli.main(["run", "--cluster", "c1", "--workdir", str(tmp_path), "--", "python", "train.py"]) == 0
    assert sent == [("node0", "/fsx/scaletrain")]
    [(output, script)] = head.scripts
    lines = script.splitlines()
    assert output.startswith("/fsx/scaletrain/runs/") and output.endswith("-run")
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=8" in lines
    assert "--rendezvous-port 29500 --no-resume --" in script
    assert "-np 16" in script and "FI_EFA_USE_HUGE_PAGE=0" in script and "/opt/amazon/openmpi/bin/mpirun" in script
    assert script.rstrip().endswith("-m launcher.execute.userrank --workdir /fsx/scaletrain/work/proj-1 --python-bin "
                                    "/opt/scaletrain/venv/bin --reducers 0 -- python train.py")
    assert "job 42 succeeded" in capsys.readouterr().out


# --- --max-restarts and the stack's storage: a replacement node must have the run's storage by itself -------------


def test_max_restarts_on_a_beegfs_stack_is_refused_in_one_line_before_anything_starts(head, capsys):
    """BeeGFS lives on the nodes' RAM disks, set up by the launcher: an Auto Scaling replacement joins none of it."""
    deploy(head=True, storage="beegfs")
    assert train("--max-restarts", "2") == 1
    assert head.commands == [] and head.scripts == [] and head.trained == []  # no node was asked anything
    assert capsys.readouterr().err == (
        "error: --max-restarts needs storage a replacement node mounts by its own boot (fsx); this cluster's beegfs "
        "lives on the nodes' RAM disks, which a replacement does not join; deploy with -c storage=fsx or run without "
        "--max-restarts\n")
    assert stack_exists()


def test_max_restarts_on_an_fsx_stack_is_kept_by_the_slurm_job(head, capsys):
    """FSx is mounted by every node's own boot (its /etc/fstab line), a replacement's too: the job restarts."""
    deploy(head=True, storage="fsx")
    assert train("--max-restarts", "2") == 0
    [(_, script)] = head.scripts
    assert "--max-restarts 2" in script
    assert "--max-restarts needs" not in capsys.readouterr().err


def test_launch_run_refuses_max_restarts_on_a_beegfs_stack_as_train_does(head, tmp_path, capsys):
    deploy(head=True, storage="beegfs")
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert cli.main(["run", "--cluster", "c1", "--workdir", str(tmp_path), "--max-restarts", "1", "--",
                     "python", "train.py"]) == 1
    assert head.commands == [] and head.scripts == []
    assert "error: --max-restarts needs storage a replacement node mounts by its own boot" in capsys.readouterr().err


def test_without_max_restarts_a_beegfs_stack_runs_as_before(head, capsys):
    deploy(head=True, storage="beegfs")
    assert train("--max-restarts", "0") == 0
    assert len(head.scripts) == 1 and "--max-restarts needs" not in capsys.readouterr().err
