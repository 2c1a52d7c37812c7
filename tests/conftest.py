import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


# --- Every AWS API call the launcher makes in the tests (tests/test_zz_launcher_iam_policy.py reads it) -------------
# A call counts when the nearest frame of the project's own code (infra/ aside: the launcher runs its idle check) is in
# launcher/: the tests' own set-up calls (moto stacks, buckets; the fake CDK a launcher test puts in place) and the
# nodes' calls (training/, the AWS CLI on a node) are another identity's. Recorded as IAM actions (service prefix:API
# operation), into one set for the session, and written to $SCALETRAIN_AWS_CALLS_OUT at its end when that is set.
import os  # noqa: E402

import botocore.client  # noqa: E402
import pytest  # noqa: E402

LAUNCHER_AWS_CALLS: set[str] = set()
_ROOT = Path(__file__).resolve().parent.parent
_LAUNCHER_DIR = str(_ROOT / "launcher") + os.sep
_PROJECT_DIRS = tuple(str(_ROOT / d) + os.sep for d in ("tests", "training", "ami"))
_IAM_PREFIX = {"service-quotas": "servicequotas"}  # botocore's service name -> IAM's prefix, where they differ
_make_api_call = botocore.client.BaseClient._make_api_call


def _recording_api_call(self, operation_name, api_params):
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_LAUNCHER_DIR):
            service = self.meta.service_model.service_name
            LAUNCHER_AWS_CALLS.add(f"{_IAM_PREFIX.get(service, service)}:{operation_name}")
            break
        if name.startswith(_PROJECT_DIRS):
            break
        frame = frame.f_back
    return _make_api_call(self, operation_name, api_params)


botocore.client.BaseClient._make_api_call = _recording_api_call


def pytest_configure(config):
    # The suite leaves the machine as it found it: /etc, /usr, /opt, network namespaces, mounts, processes
    # (tests/machine_check.py, issue 37 item 9).
    if not config.pluginmanager.has_plugin("machine_check"):
        config.pluginmanager.import_plugin("machine_check")


def pytest_sessionfinish(session, exitstatus):
    out = os.environ.get("SCALETRAIN_AWS_CALLS_OUT")
    if out:
        Path(out).write_text("".join(f"{call}\n" for call in sorted(LAUNCHER_AWS_CALLS)))


# --- Two test processes (`make test`: pytest -n 2) ---------------------------------------------------------------
# Each module stays in one process, so its module-scoped fixtures (a synth, a cluster, shards) are made once; and two
# kinds of module run in one process each, one module after another, in file order:
# - "serial": every module with a test marked cluster (rehearsal nodes take the first free subnet and bridge name, and
#   two clusters coming up at once would race for them), and the modules that bound how soon Ctrl-C ends a command
#   (another process busy on both cores must not decide those);
# - "aws": the launcher's tests against moto, tests/test_zz_launcher_iam_policy.py last: it reads the AWS calls this
#   process recorded (LAUNCHER_AWS_CALLS) in all of them.
# xdist's own `--dist loadgroup` would do this with xdist_group marks, but with pytest 9.2 it no longer groups
# (pytest-dev/pytest-xdist#1386: it renames the tests' ids, which pytest no longer lets it), so the grouping is a
# scheduler of its own, LoadScopeScheduling's with the group as its scope.
TIMING_MODULES = {"test_data_interrupt", "test_local_exec_interrupt", "test_ssh_keepalive"}
# Cluster modules whose clusters are sshd processes on 127.0.0.1 (`launch local up --loopback`), on ports the kernel
# hands out: no subnet, bridge or namespace to race a rehearsal cluster for, so they run beside the serial group. That
# group is the suite's critical path (40 of 40.5 minutes on 2026-11-28, the other process idle for its last 19).
LOOPBACK_MODULES = {"test_local_cluster", "test_local_kill", "test_awsrun_nodes"}


def scope_of(module: str, source: str, aws_modules) -> str:
    if module in LOOPBACK_MODULES:
        return module
    if "mark.cluster" in source or module in TIMING_MODULES:
        return "serial"
    return "aws" if module in aws_modules else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from test_zz_launcher_iam_policy import AWS_MODULES
    from xdist.scheduler import LoadScopeScheduling

    groups: dict[str, str] = {}

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path not in groups:
                file = config.rootpath / path
                source = file.read_text() if file.is_file() else ""
                groups[path] = scope_of(file.stem, source, AWS_MODULES)
            return groups[path]

    return GroupScheduling(config, log)


@pytest.fixture
def ssm_plugin(tmp_path, monkeypatch):
    """The AWS CLI's Session Manager plugin on PATH, as on a machine set up for the AWS path (README): a stand-in
    that is never run (no test opens an SSM session); preflight and the SSH to an AWS cluster's nodes look for it."""
    bin_ = tmp_path / "ssm-plugin-bin"
    bin_.mkdir()
    plugin = bin_ / "session-manager-plugin"
    plugin.write_text("#!/bin/sh\necho 'session-manager-plugin stand-in: not for use' >&2\nexit 1\n")
    plugin.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return plugin
