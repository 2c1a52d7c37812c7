"""`launch run`'s decisions (launcher/plans/userjob.py) and its per-process wrapper (launcher/execute/userrank.py),
without a cluster: which files travel, what torchrun variables each process gets, and the job's mpirun line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from golden import assert_golden

from launcher.plans import slurm, userjob

PATTERNS = userjob.ignore_patterns("# data stays on S3\ndata/\n*.ckpt\nlogs/*.txt\n")


@pytest.mark.parametrize("path,left_out", [
    ("train.py", False), ("pkg/model.py", False),
    (".git/config", True), ("pkg/__pycache__/m.cpython-311.pyc", True), (".venv/bin/python", True),
    ("data/train.tar", True), ("data", True), ("mydata/x", False),           # a pattern names a folder, not a prefix
    ("runs/epoch3.ckpt", True), ("logs/a.txt", True), ("logs/deep/a.txt", False), ("logs/a.log", False),
])
def test_what_the_working_directory_sends(path, left_out):
    assert userjob.ignored(path, PATTERNS) is left_out


def test_sync_sends_what_changed_and_removes_what_is_gone():
    remote = {"a.py": (10, 1), "b.py": (20, 2), "gone.py": (5, 5)}
    local = {"a.py": (10, 1),       # same size and time: not sent
             "b.py": (20, 3),       # same size, touched: sent (rsync's quick check)
             "c.py": (7, 1)}        # new
    plan = userjob.sync_plan(local, remote)
    assert plan.send == ("b.py", "c.py") and plan.delete == ("gone.py",)
    assert plan.unchanged == 1 and plan.send_bytes == 27
    assert userjob.sync_plan(local, {}).send == ("a.py", "b.py", "c.py")
    assert userjob.sync_plan(local, local).send == ()


def test_a_size_change_alone_is_sent():
    assert userjob.sync_plan({"a": (11, 1)}, {"a": (10, 1)}).send == ("a",)


def test_the_copy_of_a_directory_has_one_place():
    a = userjob.workdir_name("/home/me/proj", "laptop")
    assert a == userjob.workdir_name("/home/me/proj", "laptop") and a.startswith("proj-")
    assert a != userjob.workdir_name("/home/you/proj", "laptop") != userjob.workdir_name("/home/me/proj", "other")
    assert userjob.workdir_name("/x/my proj;rm", "h").startswith("my_proj_rm-")


def ompi(rank: int, size: int, local: int, local_size: int) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}


@pytest.mark.parametrize("rank,local,node", [(0, 0, "0"), (1, 1, "0"), (2, 0, "1"), (3, 1, "1")])
def test_torchrun_variables_of_two_nodes_of_two(rank, local, node):
    env = userjob.torchrun_env(ompi(rank, 4, local, 2), job_id="7", restarts="1")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == \
        (str(rank), "4", str(local), "2", node)
    assert env["GROUP_RANK"] == node and env["TORCHELASTIC_RESTART_COUNT"] == "1" and env["TORCHELASTIC_RUN_ID"] == "7"


def test_not_under_mpirun_is_said():
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_LOCAL_RANK"):
        userjob.torchrun_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"})


@pytest.mark.parametrize("asked,expected", [(None, 2), (1, 1), (4, 4)])
def test_processes_per_node(asked, expected):
    from test_plan import local_cluster

    node = local_cluster(1).nodes[0].model_copy(update={"slots": 2, "cpus": 4})
    assert userjob.procs_per_node(node, asked) == expected


@pytest.mark.parametrize("asked,why", [(0, "--procs-per-node must be >= 1"),
                                       (5, "--procs-per-node 5 is more than the 4 vCPU")])
def test_processes_per_node_refused(asked, why):
    """One over the node's vCPUs would queue a job Slurm can never start."""
    from test_plan import local_cluster

    with pytest.raises(ValueError, match=why):
        userjob.procs_per_node(local_cluster(1).nodes[0].model_copy(update={"cpus": 4}), asked)


def test_the_run_jobs_mpirun_line():
    from test_plan import local_cluster

    c = local_cluster(2)
    argv = userjob.run_mpirun(c, c.select_workers(2), procs=2, workdir="/shared/work/proj-1", output="/shared/runs/r",
                              command=["python", "train.py", "--lr", "0.1"], engine="ddp",
                              fabric_env={"FI_PROVIDER": "efa"}, mca=[], checkpoint_to="s3://b/p")
    assert_golden("userjob-mpirun-local-2.json", json.dumps(argv, indent=1) + "\n")
    assert argv[argv.index("-np") + 1] == "4"                   # two nodes of two processes
    pairs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert pairs["plm"] == "slurm"                               # daemons through Slurm, not SSH
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    # The rendezvous is the job step's, forwarded by name: a replacement node has a new address.
    assert "MASTER_ADDR" in exported and "MASTER_PORT" in exported
    assert not any(x.startswith("MASTER_ADDR=") for x in exported)
    assert "SCALETRAIN_ENGINE=ddp" in exported and "SCALETRAIN_CHECKPOINT_TO=s3://b/p" in exported
    assert "FI_PROVIDER=efa" in exported
    if c.mpi_interface:
        assert f"GLOO_SOCKET_IFNAME={c.mpi_interface}" in exported
    assert argv[-5:] == ["--", "python", "train.py", "--lr", "0.1"]


def test_the_run_jobs_batch_script_asks_the_step_for_a_rendezvous():
    job = slurm.BatchJob(name="run-python", nodes=2, slots=2, output="/shared/runs/r", python="/opt/py",
                         mpirun=("mpirun", "x"), rendezvous_port=userjob.MASTER_PORT, submitted_by="launch run")
    text = slurm.batch_script(job)
    assert "--rendezvous-port 29500 -- mpirun x" in text and "Submitted by `launch run`" in text
    assert "--rendezvous-port" not in slurm.batch_script(slurm.BatchJob(**{**job.__dict__, "rendezvous_port": None}))


def rank(tmp_path: Path, env: dict[str, str], *command: str, options: tuple[str, ...] = ()
         ) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "RANK", "WORLD_SIZE"))}
    return subprocess.run([sys.executable, "-m", "launcher.execute.userrank", "--workdir", str(tmp_path),
                           "--python-bin", "/opt/image/bin", *options, "--", *command], env=clean | env,
                          capture_output=True, text=True, timeout=60)


def test_the_run_jobs_mpirun_line_names_its_requirements_set_before_the_command():
    from test_plan import local_cluster

    c = local_cluster(2)
    how = {"procs": 1, "workdir": "/w", "output": "/o", "command": ["python", "t.py"], "engine": "ddp",
           "fabric_env": {}, "mca": []}
    argv = userjob.run_mpirun(c, c.select_workers(2), **how, requirements_set="/fsx/scaletrain/envs/abc.json")
    at = argv.index("--requirements-set")
    assert argv[at + 1:] == ["/fsx/scaletrain/envs/abc.json", "--", "python", "t.py"]
    assert "--requirements-set" not in userjob.run_mpirun(c, c.select_workers(2), **how)


def test_a_process_runs_with_its_requirements_environment_first(tmp_path):
    """A set whose environment is made: the command's PATH starts with its bin/, VIRTUAL_ENV names it, and nothing
    is made again. A set document that cannot be read is one line and exit 1."""
    env = tmp_path / "envs" / "abc"
    (env / "bin").mkdir(parents=True)
    (env / ".scaletrain-ready").write_text("abc\n")
    doc = tmp_path / "envs" / "abc.json"
    doc.write_text(json.dumps({"hash": "abc", "env": str(env), "pins": [], "wheels": []}))
    script = "import os; print(os.environ['PATH'].split(':')[:2], os.environ['VIRTUAL_ENV'])"
    out = rank(tmp_path, ompi(0, 1, 0, 1), sys.executable, "-c", script, options=("--requirements-set", str(doc)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == f"[rank 0] ['{env}/bin', '/opt/image/bin'] {env}\n"
    bad = rank(tmp_path, ompi(1, 2, 1, 2), "true", options=("--requirements-set", str(tmp_path / "none.json")))
    assert bad.returncode == 1 and bad.stdout.startswith("[rank 1] error: cannot read the requirements set "), bad
    assert len(bad.stdout.splitlines()) == 1


def test_each_process_gets_torchruns_variables_in_the_synced_directory(tmp_path):
    script = ("import os; print(os.getcwd()); print(' '.join(os.environ[k] for k in ('RANK', 'WORLD_SIZE', "
              "'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'MASTER_ADDR'))); "
              "print(os.environ['PATH'].split(':')[0])")
    out = rank(tmp_path, {**ompi(3, 4, 1, 2), "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500"},
               sys.executable, "-c", script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [f"[rank 3] {tmp_path}", "[rank 3] 3 4 1 2 1 10.0.0.2",
                                       "[rank 3] /opt/image/bin"]


def test_a_failing_command_fails_its_process(tmp_path):
    out = rank(tmp_path, ompi(0, 1, 0, 1), sys.executable, "-c", "import sys; print('bad'); sys.exit(3)")
    assert out.returncode == 3 and out.stdout == "[rank 0] bad\n"


def test_a_command_that_does_not_exist_is_one_line(tmp_path):
    out = rank(tmp_path, ompi(0, 1, 0, 1), "no-such-program-xyz")
    assert out.returncode == 127
    assert out.stdout.strip() == (f"[rank 0] error: cannot run 'no-such-program-xyz' in {tmp_path}: "
                                  "No such file or directory")


def test_with_reducers_the_workers_run_the_command_and_the_reducers_the_tier():
    """seed 004's tier under launch run: one MPMD line, the workers (ranks 0..W-1) the user's command with
    SCALETRAIN_ENGINE=reducer, then one `training.reducer --workers W` per reducer node."""
    from test_plan import local_cluster

    c = local_cluster(2, reducers=1)
    argv = userjob.run_mpirun(c, c.select_workers(2), procs=1, workdir="/w", output="/o", command=["python", "t.py"],
                              engine="reducer", fabric_env={}, mca=[], reducers=c.reducers[:1])
    workers, reducers = " ".join(argv).split(" : ")
    assert "-x SCALETRAIN_ENGINE=reducer" in workers and "-x SCALETRAIN_REDUCERS=1" in workers
    assert workers.endswith("launcher.execute.userrank --workdir /w --python-bin /state/venv/bin --reducers 1 -- "
                            "python t.py")
    assert reducers.startswith("-np 1 -host reducer0:1") and reducers.endswith("-m training.reducer --workers 2")
    assert "-x MASTER_ADDR " in reducers + " " and "MASTER_ADDR=" not in " ".join(argv)
    with pytest.raises(ValueError, match="needs reducer nodes"):
        userjob.run_mpirun(c, c.select_workers(2), procs=1, workdir="/w", output="/o", command=["x"],
                           engine="reducer", fabric_env={}, mca=[])


def test_the_workers_world_leaves_the_reducers_out():
    env = userjob.torchrun_env(ompi(1, 3, 0, 1), reducers=1)
    assert (env["RANK"], env["WORLD_SIZE"], env["NODE_RANK"]) == ("1", "2", "1")


def test_the_step_names_the_allocated_nodes_in_the_mpmd_line():
    from launcher.execute import jobstep

    argv = ["mpirun", "-np", "2", "-host", "node0:1,node1:1", "prog", ":", "-np", "1", "-host", "reducer0:1", "red"]
    assert jobstep.with_hosts(argv, ["node2:1,node3:1", "reducer1:1"]) == \
        ["mpirun", "-np", "2", "-host", "node2:1,node3:1", "prog", ":", "-np", "1", "-host", "reducer1:1", "red"]


def test_a_batch_job_with_reducers_asks_for_both_kinds_of_node():
    job = slurm.BatchJob(name="t", nodes=2, slots=8, output="/o", python="/py", mpirun=("m",), reducers=3)
    text = slurm.batch_script(job)
    assert "#SBATCH --nodes=5" in text and "#SBATCH --constraint=[worker*2&reducer*3]" in text
    assert " --reducers 3 -- m" in text
    plain = slurm.batch_script(slurm.BatchJob(**{**job.__dict__, "reducers": 0}))
    assert "#SBATCH --nodes=2" in plain and "#SBATCH --constraint=worker\n" in plain and "--reducers" not in plain
