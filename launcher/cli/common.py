"""What every command module shares: the consoles it prints on, the common options, and which cluster a command
means."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console

from launcher import cluster as clusters
from launcher.errors import LaunchError

# rich sizes tables to a terminal; when stdout is piped or logged it takes 80 columns (or the width of a terminal on
# stdin) and squeezes a wide table into unreadable `i…` columns. A log has no width: it gets one no table of ours
# reaches, so every table is printed at its natural width. An explicit COLUMNS still wins.
LOG_WIDTH = 1000


def _width(stream) -> int | None:
    """None (rich measures the terminal) on a terminal or with COLUMNS set; LOG_WIDTH for a pipe or a file."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS", "").isdigit() else LOG_WIDTH


console = Console(soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, soft_wrap=True, width=_width(sys.stderr))

ClusterOpt = typer.Option(None, "--cluster", help="A cluster this machine knows (`launch local up`, `launch "
                                                   "discover`), or an AWS stack's name, discovered then; default: "
                                                   "the only cluster known here, else the stack $SCALETRAIN_STACK "
                                                   "or 'scaletrain'.")

RegionOpt = typer.Option(None, "--region", help="AWS region; default: the saved cluster's, else AWS_REGION, "
                                                "AWS_DEFAULT_REGION or the profile's, as the AWS CLI chooses, else "
                                                "cdk.json's (where `npx cdk deploy` puts the stack).")
ProfileOpt = typer.Option(None, "--profile", help="AWS profile; default: the saved cluster's, else AWS_PROFILE's "
                                                  "or the default profile.")
DEFAULT_STACK = "scaletrain"  # infra's default cluster_name


def aws_session(c: clusters.Cluster | None, region: str | None, profile: str | None, *, cluster: str | None = None):
    """The AWS session for a command about cluster ``c``: --region/--profile, else the saved cluster's, else the AWS
    environment's (launcher.cluster.aws.api.session, the one place a region is chosen). With no saved cluster (a
    stack to discover, named ``cluster`` or not) a failure says what this machine knows too, as resolve does."""
    from launcher.cluster.aws import api as aws

    saved = c.aws if c is not None else None
    region, profile = region or (saved.region if saved else None), profile or (saved.profile if saved else None)
    try:
        try:
            return aws.session(region, profile)
        except LaunchError as e:
            # Nothing names a region: the stack's own, where `npx cdk deploy` and `launch preflight`/`up` put it
            # (cdk.json's context; infra/app.py deploys into spec.region whatever the environment says).
            stack_region = None if region or str(e) != aws.NO_REGION else cdk_region()
            if stack_region is None:
                raise
            return aws.session(stack_region, profile)
    except LaunchError as e:
        if c is not None:
            raise
        raise _nowhere(cluster, e) from None


def cdk_json() -> Path | None:
    """The project's cdk.json: in the current directory, else the checkout's."""
    return next((p for p in (Path("cdk.json"), Path(__file__).resolve().parents[2] / "cdk.json") if p.is_file()), None)


def cdk_region() -> str | None:
    """The region cdk.json's context deploys the stack into, or None."""
    import json

    path = cdk_json()
    try:
        region = json.loads(path.read_text()).get("context", {}).get("region") if path else None
    except (OSError, ValueError):
        return None
    return region if isinstance(region, str) and region else None


def _nowhere(cluster: str | None, e: LaunchError) -> LaunchError:
    """The one answer for a cluster neither this machine nor AWS has: what is known here, then what AWS said."""
    here = (f"unknown cluster '{cluster}'; known clusters: {', '.join(clusters.known_names()) or 'none'}"
            if cluster is not None else
            "no cluster is up; start one with `launch local up --nodes 2` (or deploy one with `npx cdk deploy`)")
    return LaunchError(f"{here}; on AWS: {e}")


def resolve(cluster: str | None, region: str | None = None, profile: str | None = None, *,
            reach: bool = False) -> clusters.Cluster:
    """The cluster a command means, one answer for every command: a cluster saved on this machine by that name (or
    the only one), else the AWS stack of that name (default $SCALETRAIN_STACK or 'scaletrain'), discovered now. When
    neither is found the one line says both: what this machine knows and why AWS had none. ``reach``: the command
    logs in to the nodes (ssh, exec, doctor), so a stack found now is made reachable as `launch discover` makes it
    (the nodes ready, the launcher's key on them over SSM, the nodes' access files); a read (status) only reads."""
    c, stack = target(cluster)
    if c is not None:
        return c
    assert stack is not None
    from launcher.cluster.aws import api as aws

    sess = aws_session(None, region, profile, cluster=cluster)
    try:
        aws.stack_outputs(sess, stack)  # the stack exists, or the one line below says why not
    except LaunchError as e:
        raise _nowhere(cluster, e) from None
    if not reach:
        return aws.discover_cluster(sess, stack, profile=profile)
    from launcher.execute import awsrun

    found = awsrun.connect_ready(sess, stack, profile=profile)
    awsrun.install_node_access(found)
    return found


def require_stack(sess, stack: str, cluster: str | None) -> None:
    """The stack ``stack`` is in the session's region (in any state: a failed one can still be deleted), else the one
    line resolve gives for a cluster nobody knows: what this machine knows and what AWS said."""
    from launcher.cluster.aws import api as aws

    try:
        with aws.aws_errors(f"stack '{stack}'"):
            sess.client("cloudformation").describe_stacks(StackName=stack)
    except LaunchError as e:
        if "does not exist" in str(e):
            e = LaunchError(f"no stack '{stack}' in {sess.region_name} (wrong region? pass --region); deploy one "
                            f"with `npx cdk deploy -c cluster_name={stack}`")  # as aws.stack_outputs says it
        raise _nowhere(cluster, e) from None


def target(cluster: str | None) -> tuple[clusters.Cluster | None, str | None]:
    """(the saved cluster, or None; the AWS stack to use, or None for a local cluster).

    A name the launcher does not know is taken as a stack to discover; with no name and no saved cluster, the
    stack is $SCALETRAIN_STACK or infra's default name.
    """
    if cluster is not None and not cluster.strip():  # '' would quietly mean "the default cluster"
        raise usage_error(f"--cluster needs a name, got {cluster!r}")
    names = clusters.known_names()
    if cluster in names or (cluster is None and names):
        c = clusters.load(cluster)
        return c, (c.aws.stack if c.aws else c.name) if c.backend == "aws" else None
    return None, cluster or os.environ.get("SCALETRAIN_STACK") or DEFAULT_STACK


# --- Bad input on the command line ------------------------------------------------------------------------------
# One translator for every command: a value an option refuses is a usage error (exit 2 and one line, as click says
# its own "Invalid value for '--nodes'"), named by the option the user typed (--gpu-throughput, never the Python
# field gpu_throughput) in the project's words, never pydantic's ("Input should be greater than 0").


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 shard', '2 shards'."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def chosen_engine(engine: str, reducers: int, engines: tuple[str, ...] | list[str], tier_with: str) -> str:
    """The engine a run uses, from --engine and --reducers K (launch train and launch run say them alike): the
    reducer tier when K > 0, which pairs with ``tier_with`` (the command's default engine) or 'reducer' only."""
    if engine not in engines:
        raise usage_error(f"--engine must be one of: {', '.join(engines)}; got '{engine}'")
    if reducers < 0:
        raise usage_error(f"--reducers must be >= 0, got {reducers}")
    if reducers and engine not in (tier_with, "reducer"):
        raise usage_error(f"--reducers uses the reducer engine; leave out --engine {engine}")
    if engine == "reducer" and not reducers:
        raise usage_error("--engine reducer needs --reducers K (reducer nodes of the cluster)")
    return "reducer" if reducers else engine


def usage_error(message: str) -> click.UsageError:
    """``raise usage_error("--nodes must be >= 1, got 0")``: `launch` prints `error: <message> (see `launch X
    --help`)` and exits 2, as for click's own usage errors. Python field names in the message become options."""
    return click.UsageError(option_names(message), ctx=click.get_current_context(silent=True))


def _flags() -> dict[str, str]:
    """The running command's parameters: Python name -> the option a user types (its longest flag)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return {}
    return {p.name: max(p.opts, key=len) for p in ctx.command.params
            if p.name and isinstance(p, click.Option) and p.opts}


def option_names(text: str, flags: Mapping[str, str] | None = None) -> str:
    """``text`` with each Python field name of a command option written as the option (``gpu_throughput`` ->
    ``--gpu-throughput``). Only names with an underscore: plain words (nodes, epochs) are English too."""
    flags = _flags() if flags is None else flags
    for name, flag in flags.items():
        if "_" in name:
            text = re.sub(rf"(?<![-\w]){re.escape(name)}(?!\w)", flag, text)
    return text


def plain(error: Mapping[str, Any]) -> str:
    """What one pydantic error says, in the project's words (the caller puts the option before it): 'must be > 0,
    got -1'. pydantic's own sentence is used only for types this does not know, with its 'Input should' reworded."""
    kind, ctx, got = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    shown = f"{got:g}" if isinstance(got, float) else str(got)
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"must be {bounds[kind]} {limit:g}, got {shown}" if isinstance(limit, float) \
            else f"must be {bounds[kind]} {limit}, got {shown}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}, got '{shown}'"
    if kind in ("int_parsing", "int_from_float", "int_type"):
        return f"must be a whole number, got '{shown}'"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"must be a (finite) number, got '{shown}'"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got '{shown}'"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not an option here"
    return reword(str(error.get("msg", "is not valid")).removeprefix("Value error, "))


# pydantic's sentences as they reach a message already made into text (infra.spec's one line for `-c KEY=VALUE`).
_PYDANTIC = ((r"[Ii]nput should be greater than or equal to ", "must be >= "),
             (r"[Ii]nput should be greater than ", "must be > "),
             (r"[Ii]nput should be less than or equal to ", "must be <= "),
             (r"[Ii]nput should be less than ", "must be < "),
             (r"[Ii]nput should be a valid integer(, [^;]*)?", "must be a whole number"),
             (r"[Ii]nput should be a valid number(, [^;]*)?", "must be a number"),
             (r"[Ii]nput should be a valid boolean(, [^;]*)?", "must be true or false"),
             (r"[Ii]nput should be ", "must be "))


def reword(text: str) -> str:
    """``text`` with pydantic's phrasing ("input should be greater than or equal to 1") in the project's words."""
    for pattern, words in _PYDANTIC:
        text = re.sub(pattern, words, text)
    return text


def validation_error(e: Any, options: Mapping[str, str] | None = None) -> click.UsageError:
    """The first error of a pydantic ``ValidationError`` as one usage-error line, named by its option: ``options``
    maps a model field to the option text (default: the running command's option of that name, else --field)."""
    first = e.errors(include_url=False)[0]
    field = str(first["loc"][0]) if first.get("loc") else ""
    option = (options or {}).get(field) or _flags().get(field) or f"--{field.replace('_', '-')}"
    return usage_error(f"{option} {plain(first)}")


# --- Checks several commands share, made before any cluster or AWS is asked ----------------------------------------


def check_named(option: str, value: str | None, what: str) -> None:
    """An option given as '' (or blanks), which would quietly mean its default, is a usage error: ``what`` says
    what the option takes ("a region name such as us-east-1")."""
    if value is not None and not value.strip():
        raise usage_error(f"{option} needs {what}, got {value!r}")


def check_cluster_name(option: str, value: str | None) -> None:
    """A cluster's name as this machine keeps it (a directory under $SCALETRAIN_HOME/clusters): '' or a path such as
    ../x (which `launch local down` would have looked for, and removed, outside that directory) is a usage error."""
    check_named(option, value, "a name")
    if value is not None and (Path(value).name != value or value in (".", "..")):
        raise usage_error(f"{option} must be a cluster's name, not a path; got {value!r}")


def output_dir(option: str, value: str) -> Path:
    """--out DIR of a command that writes a directory (made when it is not there): one usage-error line, before
    anything is computed, for '' (Path('') is '.', the current directory), a file, a symbolic link loop or one to
    nothing, in DIR itself or on its way (mkdir would say only "File exists")."""
    import errno
    import stat

    check_named(option, value, "a directory name")
    if value.startswith("-"):  # `--out --help` wrote the report into ./--help
        raise usage_error(f"{option} {value} looks like an option, not a directory; for a directory of that name "
                          f"write ./{value}")
    path = Path(value)
    there = next(p for p in (path, *path.parents) if os.path.lexists(p))  # the part of DIR that exists
    try:
        mode = os.stat(there).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise usage_error(f"{option} {value}: {there} is a symbolic link loop; name a directory") from None
        if e.errno == errno.ENOENT and os.path.islink(there):
            raise usage_error(f"{option} {value}: {there} is a symbolic link to {os.readlink(there)}, which does not "
                              f"exist; name a directory") from None
        raise LaunchError(f"{option} {value}: {there}: {e.strerror or e}") from None
    if not stat.S_ISDIR(mode):
        raise usage_error(f"{option} {value} is a file; name a directory" if there == path else
                          f"{option} {value}: {there} is a file, not a directory")
    return path


def check_aws_options(region: str | None, profile: str | None) -> None:
    """--region and --profile, when given, name something: '' would quietly mean the environment's."""
    check_named("--region", region, "a region name such as us-east-1")
    check_named("--profile", profile, "a profile name (as in ~/.aws/config)")


def check_seconds(option: str, value: float, *, zero: bool = True, note: str = "") -> None:
    """A duration option: a finite number of seconds, >= 0 (``zero``) or > 0; else one usage-error line that names
    the option and what it takes (``note``: what 0 means, say)."""
    import math

    bound = ">=" if zero else ">"
    if not (value >= 0 if zero else value > 0):  # nan too
        raise usage_error(f"{option} must be a number of seconds {bound} 0{note}, got {value:g}")
    if not math.isfinite(value):
        raise usage_error(f"{option} must be a finite number of seconds {bound} 0{note}, got {value:g}")


def stack_session(c: clusters.Cluster | None, stack: str, region: str | None, profile: str | None, *,
                  cluster: str | None = None):
    """The AWS session for a command that runs on the stack ``stack`` (train, run), chosen as for every command
    (aws_session); a stack this machine has not saved must be there, else the one line resolve gives: what this
    machine knows and what AWS said."""
    sess = aws_session(c, region, profile, cluster=cluster)
    if c is None:
        from launcher.cluster.aws import api as aws

        try:
            aws.stack_outputs(sess, stack)
        except LaunchError as e:
            raise _nowhere(cluster, e) from None
    return sess
