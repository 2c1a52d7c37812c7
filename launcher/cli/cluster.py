"""A cluster's life on AWS: `launch preflight` before deploying, `up` (preflight, then deploy where there is
capacity), `discover`, `status` (local clusters too), `ssh` (local clusters too) and `down`."""

from __future__ import annotations

import os

import typer
from rich.table import Table

from launcher import cluster as clusters
from launcher.cli.common import (
    DEFAULT_STACK,
    ClusterOpt,
    ProfileOpt,
    RegionOpt,
    aws_session,
    cdk_json,
    check_aws_options,
    check_seconds,
    console,
    require_stack,
    resolve,
    reword,
    target,
    usage_error,
)
from launcher.errors import LaunchError
from launcher.execute import remote

app = typer.Typer()


@app.command("status")
def status(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt,
           extend_ttl: float = typer.Option(None, "--extend-ttl", metavar="HOURS",
                                            help="AWS: move the stack's self-deletion this many hours later.")):
    """Nodes of a cluster and whether each answers over SSH; on AWS also uptime, cost so far and TTL left."""
    check_aws_options(region, profile)  # '' would quietly mean the default region or profile
    if extend_ttl is not None:
        from launcher.cluster.aws import lifecycle

        try:
            lifecycle.check_extension(extend_ttl)  # before anything is asked of AWS
        except LaunchError as e:
            raise usage_error(str(e)) from None
    c = resolve(cluster, region, profile)
    if c.backend == "aws":
        _status_aws(c, region, profile, extend_ttl)
        return
    if extend_ttl is not None:
        raise usage_error("--extend-ttl applies to AWS clusters; a local cluster has no TTL")
    answers = {r.node: r for r in remote.run_all(c, c.machines, "uptime -p 2>/dev/null || uptime")}
    table = Table(title=f"cluster '{c.name}' ({c.backend})")
    for col in ("node", "role", "address", "slots", "state", "uptime"):
        table.add_column(col)
    for n in c.machines:
        r = answers[n.name]
        table.add_row(n.name, n.role, n.address, str(n.slots), "ready" if r.ok else f"unreachable: {r.error}",
                      r.stdout.strip() if r.ok else "")
    console.print(table)
    _budget_status(c)
    if not all(r.ok for r in answers.values()):
        raise typer.Exit(1)


def _status_aws(c: clusters.Cluster, region: str | None, profile: str | None, extend_ttl: float | None) -> None:
    import datetime as dt

    from launcher.cluster.aws import api as aws
    from launcher.cluster.aws import lifecycle

    sess = aws_session(c, region, profile)
    assert c.aws is not None
    if extend_ttl is not None:
        start = aws.extend_ttl(sess, c, extend_ttl)
        console.print(f"TTL extended: the stack deletes itself from {start:%Y-%m-%d %H:%M:%S} UTC")
        c = clusters.load(c.name)
    now = dt.datetime.now(dt.timezone.utc)
    rows = aws.status(sess, c, now)
    newcomers = lifecycle.undiscovered({n.instance_id for n in c.nodes if n.instance_id},
                                       [(i.instance_id, i.role, i.state) for i in aws.cluster_instances(sess, c.name)])
    table = Table(title=f"cluster '{c.name}' (aws, {c.aws.region}, {c.instance_type})")
    for col in ("node", "role", "instance", "address", "state", "uptime", "cost so far (USD)"):
        # Ids and addresses are what people copy: folded onto a second line in a narrow terminal, never cut.
        table.add_column(col, justify="right" if col.startswith("cost") else "left", overflow="fold",
                         min_width=19 if col == "instance" else None)
    for n, r in zip(c.machines, rows, strict=True):
        table.add_row(n.name, n.role, n.instance_id or "", n.address, r.state, lifecycle.format_duration(r.uptime_s),
                      f"{r.cost_usd:,.2f}")
    console.print(table)
    left = lifecycle.ttl_left(c.aws.ttl_expires_at, now)
    ttl = "no TTL" if left is None else (f"{lifecycle.format_duration(left)} left (deletes itself from "
                                         f"{c.aws.ttl_expires_at})" if left > 0 else
                                         f"expired at {c.aws.ttl_expires_at}: deletion under way")
    console.print(f"cost so far: ${lifecycle.cost_so_far(rows):,.2f} (on-demand prices); TTL: {ttl}")
    _budget_status(c)
    console.print(_idle_status(sess, c.aws.stack, now), markup=False, highlight=False)
    if newcomers:
        console.print(newcomers, markup=False, highlight=False)
    if any(r.state != "running" for r in rows):
        raise typer.Exit(1)


def _budget_status(c: clusters.Cluster) -> None:
    """What --max-cost counts (the head node and storage included) and the newest jobs' spend against their caps."""
    from launcher.cli import budget as budgetcli

    for line in budgetcli.status_lines(c):
        console.print(line, markup=False, highlight=False)


def _idle_status(sess, stack: str, now) -> str:
    """The idle-stop line: how long the nodes have been idle, counted as the stack's idle check counts it."""
    from launcher.cluster.aws import api as aws
    from launcher.cluster.aws import idle
    from launcher.plans.idle import idle_line

    outputs = aws.stack_outputs(sess, stack)
    if outputs.idle_minutes is None:
        return idle_line(None, None)
    return idle_line(idle.idle_seconds(sess, outputs, now), outputs.idle_minutes)


@app.command("down")
def down(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt):
    """Delete an AWS cluster's stack, wait until it is gone, and verify no instance with its tag remains."""
    from launcher.cluster.aws import api as aws

    check_aws_options(region, profile)
    c, stack = target(cluster)
    if stack is None:
        raise LaunchError(f"cluster '{c.name if c else cluster}' is local; bring it down with `launch local down`")
    sess = aws_session(c, region, profile, cluster=cluster)  # a name nobody knows is said as every command says it
    if c is None:
        # CloudFormation's DeleteStack answers success for a name it has no stack of (the AWS CLI's delete-stack exits
        # 0), so `down --cluster typo` would report a deletion of nothing: the stack must be there first.
        require_stack(sess, stack, cluster)
    aws.teardown(sess, stack, say=lambda line: console.print(line, markup=False, highlight=False))
    if c is not None:
        import shutil

        shutil.rmtree(clusters.cluster_dir(c.name), ignore_errors=True)


ContextOpt = typer.Option(None, "--context", "-c", metavar="KEY=VALUE",
                         help="A context key of `npx cdk deploy`, as you will pass it there (cdk.json's context is "
                              "read first).")
StackRegionOpt = typer.Option(None, "--region", help="Same as -c region=REGION (the stack's region; default: "
                                                     "cdk.json's).")


def _spec_and_pairs(context: list[str] | None, region: str | None):
    """(the stack's spec, the -c pairs to hand `cdk deploy`, cdk.json's context): as `npx cdk deploy -c ...` reads
    them; bad input is one line."""
    import json

    from launcher.plans import preflight

    pairs = list(context or [])
    found = cdk_json()
    try:
        defaults = json.loads(found.read_text()).get("context", {}) if found else {}
        ctx = preflight.context_from_args(pairs, defaults)
        if region is not None and any(p.startswith("region=") for p in pairs):
            if ctx.get("region") != region:
                raise ValueError(f"--region {region} and -c region={ctx.get('region')} disagree; pass one")
        elif region is not None:
            ctx["region"], pairs = region, [*pairs, f"region={region}"]
        return preflight.spec_from_context(ctx), pairs, defaults
    except OSError as e:
        raise LaunchError(f"could not read {found}: {e.strerror or e}") from None
    except ValueError as e:  # a -c pair or --region the stack would refuse: a usage error, in the project's words
        raise usage_error(reword(str(e).splitlines()[0])) from None


@app.command("preflight")
def preflight_cmd(context: list[str] = ContextOpt, region: str = StackRegionOpt, profile: str = ProfileOpt):
    """Before `npx cdk deploy`: ask AWS (read-only) what would stop the stack's nodes: instance types offered in
    the AZ, vCPU quotas, the capacity reservation, the image. Each failure is one line naming the fix."""
    from launcher.cluster.aws import api as aws
    from launcher.execute import preflight as preflight_shell
    from launcher.plans import preflight

    check_aws_options(region, profile)
    spec, pairs, _ = _spec_and_pairs(context, region)
    facts = preflight_shell.gather(aws.session(spec.region, profile), spec)
    verdicts = preflight.decide(spec, facts)
    for line in [*preflight.render(verdicts), preflight.summary(spec, verdicts, pairs)]:
        console.print(line, markup=False, highlight=False)
    if preflight.failed(verdicts):
        raise typer.Exit(1)


@app.command("up")
def up_cmd(context: list[str] = ContextOpt, region: str = StackRegionOpt, profile: str = ProfileOpt,
           fallback_reservation: str = typer.Option(
               None, "--fallback-reservation", metavar="CR_ID",
               help="When no AZ has capacity on demand, deploy once more into this capacity reservation (in its AZ)."),
           capacity_block: bool = typer.Option(False, "--capacity-block",
                                               help="The --fallback-reservation is a Capacity Block for ML."),
           capacity_wait: float = typer.Option(900, "--capacity-wait", metavar="SECONDS",
                                               help="After a deploy, how long to wait for every node to be in "
                                                    "service.")):
    """Preflight, then `npx cdk deploy` in an AZ that offers the types; on InsufficientInstanceCapacity delete the
    failed stack and deploy in the next AZ (then, if asked, into a reservation), saying what it tried."""
    from infra.spec import _CAPACITY_RESERVATION  # -c capacity_reservation_id's rule
    from launcher.cluster.aws import api as aws
    from launcher.cluster.aws import deploy
    from launcher.execute import preflight as preflight_shell
    from launcher.plans import capacity, preflight

    if fallback_reservation is not None and not _CAPACITY_RESERVATION.fullmatch(fallback_reservation):
        raise usage_error(f"--fallback-reservation must be a capacity reservation id such as cr-0123456789abcdef0, "
                          f"got {fallback_reservation!r}")
    if capacity_block and not fallback_reservation:
        raise usage_error("--capacity-block describes --fallback-reservation; pass both")
    check_aws_options(region, profile)
    check_seconds("--capacity-wait", capacity_wait)  # inf waited for ever; nan was refused already
    spec, pairs, defaults = _spec_and_pairs(context, region)
    sess = aws.session(spec.region, profile)
    facts = preflight_shell.gather(sess, spec)
    zones = () if isinstance(facts.zones, preflight.Unread) else facts.zones
    offered = {} if isinstance(facts.offered, preflight.Unread) else facts.offered
    reservation = None
    if fallback_reservation:
        with aws.aws_errors(f"capacity reservation {fallback_reservation}"):
            found = preflight_shell.read_reservation(sess.client("ec2"), fallback_reservation)
        if found is None:
            raise LaunchError(f"--fallback-reservation {fallback_reservation}: no such capacity reservation in "
                              f"{spec.region}")
        reservation = (fallback_reservation, str(found["AvailabilityZone"]))
    try:
        plan = capacity.attempts(spec, pairs, zones=zones, offered=offered, reservation=reservation,
                                 capacity_block=capacity_block)
        first = preflight.spec_from_context(preflight.context_from_args(plan[0].context, defaults))
    except ValueError as e:
        reason = facts.offered if isinstance(facts.offered, preflight.Unread) else ""
        raise LaunchError(str(e) + (f" (offerings unread: {reason}; pass -c az=)" if reason else "")) from None
    verdicts = preflight.decide(first, facts)
    for line in preflight.render(verdicts):
        console.print(line, markup=False, highlight=False)
    if preflight.failed(verdicts):
        raise LaunchError(f"preflight: {sum(v.status == 'FAIL' for v in verdicts)} check(s) fail (FAIL above); "
                          f"nothing was deployed")
    project = cdk_json()
    say = lambda line: console.print(line, markup=False, highlight=False)  # noqa: E731
    deploy.deploy_all(sess, spec, plan, profile=profile, wait_s=capacity_wait, say=say,
                      cdk=lambda argv: deploy.run_cdk(argv, cwd=project.parent if project else None))
    say(f"next: launch discover --cluster {spec.cluster_name} --region {spec.region}")


@app.command("discover")
def discover_cmd(cluster: str = typer.Option(None, "--cluster", help="Stack name; default $SCALETRAIN_STACK or "
                                                                    "'scaletrain'."),
                 region: str = RegionOpt, profile: str = ProfileOpt,
                 ready_timeout: float = typer.Option(1800, "--ready-timeout", help="Seconds to wait for the nodes."),
                 no_wait: bool = typer.Option(False, "--no-wait", help="Only read the stack; do not wait.")):
    """Find a deployed stack's nodes, pin their host keys, write the ssh_config, and wait until all are ready."""
    from launcher.cluster.aws import api as aws
    from launcher.execute import awsrun

    check_seconds("--ready-timeout", ready_timeout)  # train's too
    check_aws_options(region, profile)
    if cluster is not None and not cluster.strip():
        raise usage_error(f"--cluster needs a stack name, got {cluster!r}")
    stack = cluster or os.environ.get("SCALETRAIN_STACK") or DEFAULT_STACK
    sess = aws_session(None, region, profile)
    if no_wait:
        c = aws.discover_cluster(sess, stack, profile=profile)
    else:
        c = awsrun.connect_ready(sess, stack, profile=profile, timeout_s=ready_timeout)
        awsrun.install_node_access(c)
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.instance_id}  {n.address:<15} {n.instance_type}  "
                      f"{n.slots} slot(s)", markup=False, highlight=False)
    console.print(f"cluster '{c.name}': {len(c.workers)} worker(s), {len(c.reducers)} reducer(s); ssh_config "
                  f"{c.ssh_config} (try: launch ssh {c.nodes[0].name})", markup=False, highlight=False)


@app.command("ssh", context_settings={"allow_interspersed_args": False})
def ssh_cmd(ctx: typer.Context, node: str = typer.Argument(..., help="Node name (node0, reducer0, ..., head)."),
            command: list[str] = typer.Argument(None, help="Command to run instead of a login shell; one that "
                                                             "starts with - goes after --."),
            cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt):
    """Open an SSH session on one node (through SSM Session Manager on AWS), host keys pinned."""
    if not node.strip():
        raise usage_error(f"NODE needs a node's name (node0, reducer0, ..., head), got {node!r}")
    given, command = options_after_node(command or [])
    if "--help" in given:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    for option, before in (("--cluster", cluster), ("--region", region), ("--profile", profile)):
        if option in given and before is not None and given[option] != before:
            raise usage_error(f"{option} is given twice ({before!r} before NODE, {given[option]!r} after); give it "
                              f"once")
    cluster, region, profile = (given.get(o, v) for o, v in (("--cluster", cluster), ("--region", region),
                                                             ("--profile", profile)))
    check_aws_options(region, profile)
    c = resolve(cluster, region, profile, reach=True)
    try:
        c.machine(node)
    except LaunchError as e:  # a name the cluster has not: the argument, as `launch local reboot` says it
        raise usage_error(str(e)) from None
    from launcher.execute import remote

    remote.require_ssm_plugin(c)
    argv = ssh_argv(c.ssh_config, node, command)
    os.execvp(argv[0], argv)


SSH_OPTIONS = ("--cluster", "--region", "--profile")


def options_after_node(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """`launch ssh NODE [OPTIONS] [--] [COMMAND]`: (the launcher's options given after NODE, the command). Options of
    launch ssh there are understood (they went to ssh, which printed its usage); any other word starting with - before
    the command is refused in one line, since it is neither ours nor surely the command's (``--`` says it is)."""
    given: dict[str, str] = {}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        if word == "--":
            return given, words[i + 1:]
        if word in ("--help", "-h"):
            given["--help"], i = "", i + 1
            continue
        name, eq, value = word.partition("=")
        if name not in SSH_OPTIONS:
            raise usage_error(f"{word} after NODE is not an option of launch ssh (it takes {', '.join(SSH_OPTIONS)}); "
                              f"a command that starts with - goes after --: launch ssh NODE -- {word} ...")
        if not eq:
            if i + 1 >= len(words):
                raise usage_error(f"{name} needs a value")
            value, i = words[i + 1], i + 1
        given[name], i = value, i + 1
    return given, words[i:]


def ssh_argv(ssh_config: str, node: str, command: list[str]) -> list[str]:
    """The ssh command line `launch ssh` runs (pure; the cluster's ssh_config pins the keys and the proxy). ``--``
    before the node: OpenSSH reads options after the destination too (ssh(1)), so a command word such as -v would
    be taken as ssh's."""
    return ["ssh", "-F", ssh_config, *(["-t"] if not command else []), "--", node, *command]
