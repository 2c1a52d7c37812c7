"""The boto3 shell of the AWS backend: fetch facts, carry out plans. Decisions live beside it in discover, readiness,
lifecycle and access (launcher.cluster.aws); nothing here decides.

Region and profile come from the standard AWS environment (AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE,
~/.aws/config) unless given; every AWS failure the user can fix ends as one LaunchError line.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError, ProfileNotFound

from infra import ttl
from launcher.cluster import Cluster, Node, cluster_dir, save
from launcher.cluster.aws import access, discover, lifecycle, readiness
from launcher.errors import LaunchError

__all__ = ["ConsoleReader", "aws_errors", "console_host_keys", "decode_console", "discover_cluster", "extend_ttl",
           "gather_facts", "install_keys", "keys_installed", "leftover_instances", "session", "stack_outputs",
           "status", "teardown", "write_node_access_files"]


@contextlib.contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Turn what boto3 raises into one line the user can act on."""
    try:
        yield
    except NoCredentialsError:
        raise LaunchError(f"{what}: no AWS credentials found; set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
                          f"AWS_SECRET_ACCESS_KEY (or run `aws configure`)") from None
    except NoRegionError:
        raise LaunchError(f"{what}: {NO_REGION}") from None
    except ProfileNotFound as e:
        raise LaunchError(f"{what}: {e}") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise LaunchError(f"{what}: {err.get('Code', 'error')}: {err.get('Message', str(e))}") from None
    except BotoCoreError as e:
        raise LaunchError(f"{what}: {str(e).splitlines()[0]}") from None


NO_REGION = ("no AWS region; pass --region, set AWS_REGION or AWS_DEFAULT_REGION, or give the profile a region "
             "(aws configure set region REGION)")


def region_from(environ: Mapping[str, str]) -> str | None:
    """The region the environment names before boto3 looks: AWS_REGION, which boto3 does not read but the AWS CLI
    does, first. "AWS_REGION ... If defined, this environment variable overrides the values in the environment
    variable AWS_DEFAULT_REGION and the profile setting region" (Environment variables to configure the AWS CLI,
    https://docs.aws.amazon.com/cli/latest/userguide/cli-configure-envvars.html). boto3 then reads AWS_DEFAULT_REGION
    and the profile's region itself, in that order."""
    return environ.get("AWS_REGION", "").strip() or None


def session(region: str | None = None, profile: str | None = None) -> boto3.Session:
    """The one place every command gets its AWS session: ``region`` (--region, or the saved cluster's), else
    AWS_REGION, AWS_DEFAULT_REGION, then the profile's region, as the AWS CLI chooses."""
    with aws_errors("AWS session"):
        sess = boto3.Session(region_name=region or region_from(os.environ), profile_name=profile)
    if not sess.region_name:
        raise LaunchError(NO_REGION)
    return sess


def stack_outputs(sess: boto3.Session, stack: str) -> discover.StackOutputs:
    cfn = sess.client("cloudformation")
    try:
        with aws_errors(f"stack '{stack}'"):
            found = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except LaunchError as e:
        if "does not exist" in str(e):
            raise LaunchError(f"no stack '{stack}' in {sess.region_name} (wrong region? pass --region); deploy "
                              f"one with `npx cdk deploy -c cluster_name={stack}`") from None
        raise
    if found["StackStatus"] not in ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE"):
        raise LaunchError(f"stack '{stack}' in {sess.region_name} is {found['StackStatus']}, not deployed")
    return discover.parse_outputs(stack, found.get("Outputs", []))


def current_expiry(sess: boto3.Session, stack: str, deployed: str | None) -> str | None:
    """The cost guard's expiry as it is now: the SSM parameter the guard reads (infra.ttl), which
    `launch status --extend-ttl` may have moved from any machine since; the TtlExpiresAt output is only the deploy-time
    value. A stack without the parameter (no TTL) or a refused read keeps ``deployed``."""
    try:
        value = sess.client("ssm").get_parameter(Name=ttl.parameter_name(stack))["Parameter"]["Value"]
        return ttl.format_expiry(ttl.parse_expiry(value))
    except (ClientError, BotoCoreError, ValueError):
        return deployed


def cluster_instances(sess: boto3.Session, stack: str, states: tuple[str, ...] = discover.LIVE_STATES
                      ) -> list[discover.Instance]:
    ec2 = sess.client("ec2")
    with aws_errors(f"instances of '{stack}'"):
        pages = ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{discover.TAG_CLUSTER}", "Values": [stack]},
            {"Name": "instance-state-name", "Values": list(states)}])
        reservations = [r for page in pages for r in page["Reservations"]]
    return discover.instances_from_response(reservations)


def image_tags(sess: boto3.Session, image_id: str) -> dict[str, str]:
    with aws_errors(f"image {image_id}"):
        images = sess.client("ec2").describe_images(ImageIds=[image_id])["Images"]
    return {t["Key"]: t["Value"] for t in (images[0].get("Tags", []) if images else [])}


def decode_console(output: str) -> str:
    """GetConsoleOutput's ``Output`` is base64 on AWS; some emulators return text. Either way, text."""
    try:
        return base64.b64decode(output, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return output


class ConsoleReader:
    """instance id -> the host keys its console shows (EC2 GetConsoleOutput), for one discovery or one wait.

    The latest output where EC2 gives it (Nitro instances: keys appear as soon as cloud-init prints them); where EC2
    refuses that (Xen: P3), the buffered output, remembered per instance so the refusal is asked for once, and said
    once (access.refuses_latest_console has the documents).
    """

    def __init__(self, sess: boto3.Session, say: Callable[[str], None] | None = None):
        self.sess, self.say = sess, say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.buffered: set[str] = set()

    def _output(self, instance_id: str, latest: bool) -> str:
        out = self.sess.client("ec2").get_console_output(InstanceId=instance_id, Latest=latest).get("Output", "")
        return decode_console(out or "")

    def __call__(self, instance_id: str) -> list[str]:
        with aws_errors(f"console output of {instance_id}"):
            if instance_id not in self.buffered:
                try:
                    return access.host_keys_from_console(self._output(instance_id, latest=True))
                except ClientError as e:
                    err = e.response.get("Error", {})
                    if not access.refuses_latest_console(err.get("Code", ""), err.get("Message", "")):
                        raise
                    if not self.buffered:
                        self.say(access.buffered_console_notice(instance_id))
                    self.buffered.add(instance_id)
            return access.host_keys_from_console(self._output(instance_id, latest=False))


def console_host_keys(sess: boto3.Session, instance_id: str) -> list[str]:
    """One node's host keys from its console (see ConsoleReader)."""
    return ConsoleReader(sess)(instance_id)


def ssm_online(sess: boto3.Session, instance_ids: list[str]) -> set[str]:
    """Instances whose SSM agent answers its ping."""
    ssm = sess.client("ssm")
    online: set[str] = set()
    with aws_errors("SSM agent status"):
        for page in ssm.get_paginator("describe_instance_information").paginate(
                Filters=[{"Key": "InstanceIds", "Values": instance_ids}]):
            online |= {i["InstanceId"] for i in page["InstanceInformationList"] if i.get("PingStatus") == "Online"}
    return online


def _keypair(directory: Path, name: str, comment: str) -> str:
    from launcher.files import keygen

    path = directory / name
    return Path(f"{path}.pub").read_text() if path.is_file() else keygen(path, comment)


def discover_cluster(sess: boto3.Session, stack: str, *, profile: str | None = None,
                     console: Callable[[str], list[str]] | None = None) -> Cluster:
    """Read the stack and its instances, write the cluster's keys, ssh_config and known_hosts, and save it.

    ``console``: instance id -> host keys (default: a ConsoleReader, EC2 GetConsoleOutput). A node (or head node)
    whose console shows no key yet is listed without one and cannot be reached until a later discovery pins it.
    """
    outputs = stack_outputs(sess, stack)
    outputs = outputs.model_copy(update={"ttl_expires_at": current_expiry(sess, stack, outputs.ttl_expires_at)})
    found = cluster_instances(sess, stack, ("pending", "running"))
    workers = [i for i in found if i.role == "worker"]
    software = discover.software_from_tags(image_tags(sess, workers[0].image_id)) if workers else {}
    d = cluster_dir(stack)
    d.mkdir(parents=True, exist_ok=True)
    _keypair(d, "id_ed25519", f"scaletrain-launcher-{stack}")
    c = discover.build_cluster(outputs, found, stack=stack, region=sess.region_name, profile=profile,
                               ssh_config=str(d / "ssh_config"), known_hosts=str(d / "known_hosts"),
                               software=software)
    read_keys = console or ConsoleReader(sess)
    keys = {n.name: read_keys(n.instance_id or "") for n in c.machines}
    write_access_files(c, keys)
    save(c)
    return c


def write_access_files(c: Cluster, keys: dict[str, list[str]]) -> None:
    """The launcher's ssh_config and known_hosts (the nodes and the head node, all through SSM), and the nodes' copies
    beside them (node_*), from pinned keys."""
    assert c.aws is not None
    d = Path(c.ssh_config).parent
    pinned = [n for n in c.machines if keys.get(n.name)]
    cfg = access.ssh_config_ssm(c.name, [(n.name, n.instance_id or "") for n in c.machines], user=c.user,
                                identity_file=str(d / "id_ed25519"), known_hosts=c.known_hosts,
                                region=c.aws.region, profile=c.aws.profile)
    reach = {n.name: [n.instance_id or n.name] for n in c.machines}
    Path(c.ssh_config).write_text(cfg)
    Path(c.known_hosts).write_text(access.known_hosts_aws([(reach[n.name], keys[n.name]) for n in pinned]))
    write_node_access_files(c, keys)


def write_node_access_files(c: Cluster, keys: dict[str, list[str]]) -> None:
    """The nodes' own key pair (made once), ssh_config and known_hosts, beside the launcher's ssh_config:
    what awsrun.install_node_access puts on every node so that mpirun on the first node reaches the others.
    (Rehearsal nodes get theirs from here too.)"""
    d = Path(c.ssh_config).parent
    _keypair(d, "node_ed25519", f"scaletrain-nodes-{c.name}")
    node_dir = str(Path(c.mpi_ssh_config).parent)
    (d / "node_ssh_config").write_text(access.node_ssh_config(
        c.name, [(n.name, n.address) for n in c.nodes], user=c.user, identity_file=f"{node_dir}/id_ed25519",
        known_hosts=f"{node_dir}/known_hosts", ports={n.name: n.port for n in c.nodes}))
    (d / "node_known_hosts").write_text(access.known_hosts_aws([
        ([n.name, access.known_host_name(n.address, n.port)], keys[n.name]) for n in c.nodes if keys.get(n.name)]))


KEYS_INSTALLED = "keys-installed"  # beside the cluster's key pairs: one instance id a line, each holding both keys
KEY_INSTALL_TIMEOUT_S = 300.0      # per call, for SendCommand to accept the nodes and for every invocation to end
KEY_INSTALL_POLL_S = 2.0


def keys_installed(c: Cluster) -> set[str]:
    """The instances that have the cluster's public keys (made once per cluster directory, so a new key pair starts
    with a new, empty record)."""
    path = Path(c.ssh_config).parent / KEYS_INSTALLED
    return set(path.read_text().split()) if path.is_file() else set()


def _record_keys_installed(c: Cluster, ids: set[str]) -> None:
    path = Path(c.ssh_config).parent / KEYS_INSTALLED
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{i}\n" for i in sorted(ids)))
    os.replace(tmp, path)


def _send_keys(ssm, c: Cluster, batch: list[tuple[str, str]], script: str, *, deadline: float, timeout_s: float,
               clock: Callable[[], float], sleep: Callable[[float], None]) -> str:
    """SendCommand, again with backoff while SSM answers InvalidInstanceId (an agent that answers its ping may not
    take commands yet), until the deadline; the command id."""
    attempt = 0
    while True:
        try:
            sent = ssm.send_command(
                InstanceIds=[iid for _, iid in batch], DocumentName="AWS-RunShellScript",
                Parameters={"commands": script.splitlines()},
                Comment=f"scaletrain {c.name}: authorize the launcher's keys"[:100])  # Comment: at most 100
            return sent["Command"]["CommandId"]
        except ClientError as e:
            err = e.response.get("Error", {})
            if err.get("Code") != "InvalidInstanceId":
                raise
            delay = access.send_retry_delay(attempt)
            if clock() + delay > deadline:
                names = ", ".join(f"{name} ({iid})" for name, iid in batch)
                raise LaunchError(f"installing the launcher's key over SSM: SendCommand still refused {names} after "
                                  f"{timeout_s:.0f} s (InvalidInstanceId: {err.get('Message', '')}); the SSM agent "
                                  f"is not registered, or this identity may not send commands to those instances"
                                  ) from None
            sleep(delay)
            attempt += 1


def install_keys(sess: boto3.Session, c: Cluster, *, online: set[str], timeout_s: float = KEY_INSTALL_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> list[str]:
    """Send both public keys (the launcher's, the nodes' own) with SSM RunShellScript to every node (and the head
    node) whose agent is ``online`` and whose instance has not got them yet (a replacement instance too), wait until
    each invocation has ended, and record the instances that succeeded; the names of the nodes done now. Any node
    whose invocation did not end in Success (or had not ended by the deadline) is one error line naming it, its
    status and stderr."""
    installed = keys_installed(c)
    targets = access.key_install_targets([(n.name, n.instance_id or "") for n in c.machines], installed=installed,
                                         online=online)
    if not targets:
        return []
    d = Path(c.ssh_config).parent
    script = "".join(access.authorize_key_script(c.user, (d / f"{k}.pub").read_text())
                     for k in ("id_ed25519", "node_ed25519"))
    ssm = sess.client("ssm")
    deadline = clock() + timeout_s
    pending: dict[str, tuple[str, str]] = {}  # instance id -> (node name, command id)
    with aws_errors("installing the launcher's key over SSM"):
        for batch in access.key_install_batches(targets):
            command_id = _send_keys(ssm, c, batch, script, deadline=deadline, timeout_s=timeout_s, clock=clock,
                                    sleep=sleep)
            pending |= {iid: (name, command_id) for name, iid in batch}
        done, failures, last = [], [], {}
        while pending:
            for iid, (name, command_id) in list(pending.items()):
                try:
                    inv = ssm.get_command_invocation(CommandId=command_id, InstanceId=iid)
                except ClientError as e:
                    # Right after SendCommand the invocation may not exist yet (GetCommandInvocation, "Errors":
                    # InvocationDoesNotExist): it is still to come.
                    if e.response.get("Error", {}).get("Code") == "InvocationDoesNotExist":
                        continue
                    raise
                status = inv.get("Status", "")
                last[iid] = status
                outcome = access.invocation_outcome(status)
                if outcome == "pending":
                    continue
                del pending[iid]
                if outcome == "success":
                    installed.add(iid)
                    _record_keys_installed(c, installed)
                    done.append(name)
                else:
                    failures.append(access.invocation_error(name, iid, status, inv.get("StatusDetails", ""),
                                                            inv.get("StandardErrorContent", "")))
            if pending and clock() >= deadline:
                failures += [access.invocation_error(name, iid, f"still {last.get(iid) or 'not started'} after "
                                                                f"{timeout_s:.0f} s")
                             for iid, (name, _) in pending.items()]
                break
            if pending:
                sleep(KEY_INSTALL_POLL_S)
    if failures:
        raise LaunchError("installing the launcher's key over SSM failed on " + "; ".join(failures))
    return done


Probe = Callable[[Cluster, list[Node]], dict[str, tuple[bool, str, str]]]


def gather_facts(sess: boto3.Session, c: Cluster, *, probe: Probe,
                 agent: Callable[[list[str]], set[str]] | None = None) -> list[readiness.NodeFacts]:
    """EC2 state and SSM ping from AWS, then ``probe`` (node -> (ssh ok, PROBE output, error)) on the nodes (and the
    head node) that are running with their agent online: no SSH attempt where it cannot succeed yet."""
    state = {i.instance_id: i.state for i in cluster_instances(sess, c.name)}
    ids = [n.instance_id for n in c.machines if n.instance_id]
    online = (agent or (lambda x: ssm_online(sess, x)))(ids)
    reachable = [n for n in c.machines if state.get(n.instance_id or "") == "running" and n.instance_id in online]
    probed = probe(c, reachable) if reachable else {}
    facts = []
    for n in c.machines:
        ok, text, error = probed.get(n.name, (False, "", "not probed"))
        p = readiness.parse_probe(text) if ok else {}
        facts.append(readiness.NodeFacts(
            name=n.name, state=state.get(n.instance_id or "", "terminated"),
            agent_online=n.instance_id in online, ssh_ok=ok,
            cloud_init=p.get("cloud_init") or None, gpus=int(p["gpus"]) if p.get("gpus", "").isdigit() else None,
            efa=int(p["efa"]) if p.get("efa", "").isdigit() else None, ssh_error=error))
    return facts


def leftover_instances(sess: boto3.Session, stack: str) -> list[tuple[str, str]]:
    return [(i.instance_id, i.state) for i in cluster_instances(sess, stack)]


def teardown(sess: boto3.Session, stack: str, *, wait_s: float = 3600, delay_s: float = 15,
             say: Callable[[str], None] = print) -> None:
    """Delete the stack, wait until it is gone, and verify no instance tagged with the cluster remains."""
    cfn = sess.client("cloudformation")
    with aws_errors(f"deleting stack '{stack}'"):
        cfn.delete_stack(StackName=stack)
    say(f"deleting stack '{stack}' in {sess.region_name} ...")
    with aws_errors(f"waiting for stack '{stack}' to be deleted"):
        cfn.get_waiter("stack_delete_complete").wait(
            StackName=stack, WaiterConfig={"Delay": delay_s, "MaxAttempts": max(1, int(wait_s // max(delay_s, 1)))})
    problem = lifecycle.leftovers_verdict(stack, sess.region_name, leftover_instances(sess, stack))
    if problem:
        raise LaunchError(problem)
    say(f"stack '{stack}' is deleted; no instance tagged scaletrain:cluster={stack} remains in {sess.region_name}")


def extend_ttl(sess: boto3.Session, c: Cluster, hours: float, now: dt.datetime | None = None) -> dt.datetime:
    """Move the cost guard's expiry ``hours`` later: read the stack's TTL parameter, write a later time to it.

    The guard reads the expiry from that parameter on every run of its schedule (infra/guard.py), so this is all an
    extension takes: ssm:GetParameter and ssm:PutParameter on the one parameter (infra.ttl.EXTEND_PERMISSIONS), and
    no iam:PassRole, which updating the schedule itself would need (infra/ttl.py says why).
    """
    if not c.aws:
        raise LaunchError(f"cluster '{c.name}' is not an AWS cluster; only a deployed stack has a TTL to extend")
    lifecycle.check_extension(hours)
    name = ttl.parameter_name(c.aws.stack)
    ssm = sess.client("ssm")
    with aws_errors(f"TTL parameter {name}"):
        try:
            current = ssm.get_parameter(Name=name)["Parameter"]["Value"]
        except ssm.exceptions.ParameterNotFound:
            raise LaunchError(f"stack '{c.aws.stack}' has no TTL parameter {name} in {sess.region_name}: it was "
                              f"deployed by an older scaletrain; redeploy it with `npx cdk deploy` to extend its "
                              f"TTL") from None
        try:
            expires = ttl.parse_expiry(current)
        except ValueError:
            expires = dt.datetime.now(dt.timezone.utc)  # the guard counts an unreadable value as expired
        start = lifecycle.extended_start(expires, hours, now or dt.datetime.now(dt.timezone.utc))
        ssm.put_parameter(Name=name, Value=ttl.format_expiry(start), Type="String", Overwrite=True)
    save(c.model_copy(update={"aws": c.aws.model_copy(update={"ttl_expires_at": ttl.format_expiry(start)})}))
    return start


def status(sess: boto3.Session, c: Cluster, now: dt.datetime | None = None) -> list[lifecycle.NodeStatus]:
    """Each node's EC2 state, uptime and cost so far, then the head node's (it is billed too); an instance gone from
    EC2 shows as 'terminated'."""
    now = now or dt.datetime.now(dt.timezone.utc)
    live = {i.instance_id: i for i in cluster_instances(sess, c.name)}
    rows = []
    for n in c.machines:
        inst = live.get(n.instance_id or "")
        rows.append(lifecycle.node_status(n.name, n.instance_type or c.instance_type or "",
                                          inst.state if inst else "terminated",
                                          inst.launch_time if inst else (n.launched_at or ""), now))
    return rows
