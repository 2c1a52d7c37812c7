"""The cluster spec and the layouts it derives: pure, no synthesis, no aws-cdk-lib."""

from __future__ import annotations

import pytest

from ami import paths
from infra import catalog, layout
from infra.spec import CAPACITY_BLOCK_TYPES, CONTEXT_KEYS, REMOVED_KEYS, ClusterSpec, SpecError

BASE = {"cluster_name": "scaletrain", "instance_type": "p4d.24xlarge", "nodes": "2"}
V100_AMI = {"ami": "ami-0123456789abcdef0"}
CR = "cr-0123456789abcdef0"
BLOCK = {"capacity_block": "true", "capacity_reservation_id": CR, "az": "us-east-1a"}


def spec(**overrides: str) -> ClusterSpec:
    return ClusterSpec.from_context({**BASE, **overrides})


# --- EFA layout --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [t.name for t in catalog.gpu_types() + [catalog.get("c5n.18xlarge")] if t.has_efa])
def test_every_efa_card_gets_one_efa_device(name: str) -> None:
    entry = catalog.get(name)
    interfaces = layout.interfaces(entry, efa=True)
    assert [i.network_card_index for i in interfaces] == list(range(entry.efa_cards))
    assert layout.efa_device_count(interfaces) == entry.efa_cards
    # The primary interface (card 0, device 0) carries the node's IP address and an EFA device...
    assert interfaces[0] == layout.Interface(0, 0, "efa")
    # ...every other card an address-less EFA-only interface, its first, at device index 0 ("For each additional
    # network interface, use the next unused network card index, device index 0, for EFA-only network interface":
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html). p5en: cards 1..15; p5: 1..31.
    assert all(i.device_index == 0 and i.interface_type == "efa-only" for i in interfaces[1:])


def test_the_infra_readme_describes_the_interface_layout_the_code_makes() -> None:
    """infra/README.md once put the EFA-only interfaces at device index 1 (the third review found it): the sentence
    that describes the layout must say what layout.interfaces makes."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parent.parent / "infra" / "README.md").read_text().split())
    said = re.search(r"card 0 device (\d) `efa`, every other card device (\d) `efa-only`", text)
    assert said, "infra/README.md no longer describes the interface layout"
    made = layout.interfaces(catalog.get("p5.48xlarge"), efa=True)
    assert (int(said[1]), int(said[2])) == (made[0].device_index, made[1].device_index)


@pytest.mark.parametrize(
    ("name", "devices"),
    [("p3dn.24xlarge", 1), ("p4d.24xlarge", 4), ("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("c5n.18xlarge", 1)],
)
def test_efa_devices_per_family(name: str, devices: int) -> None:
    assert layout.efa_device_count(layout.interfaces(catalog.get(name), efa=True)) == devices


def test_without_efa_one_plain_interface() -> None:
    for name in ("p3.16xlarge", "p4d.24xlarge", "m5.24xlarge"):
        assert layout.interfaces(catalog.get(name), efa=False) == (layout.Interface(0, 0, "interface"),)
    with pytest.raises(ValueError, match="p3.16xlarge has no EFA"):
        layout.interfaces(catalog.get("p3.16xlarge"), efa=True)


def test_efa_follows_the_type_unless_turned_off() -> None:
    assert spec().efa_devices_per_node == 4
    assert spec(efa="false").efa_devices_per_node == 0
    assert spec(efa="false").worker_interfaces == (layout.Interface(0, 0, "interface"),)
    assert spec(instance_type="p3.16xlarge", **V100_AMI).efa_devices_per_node == 0


# --- Reducers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker", "reducer", "transport"),
    [
        ("p3dn.24xlarge", "c5n.18xlarge", "efa"),
        ("g5.48xlarge", "c5n.9xlarge", "efa"),
        ("p3dn.24xlarge", "m5.24xlarge", "tcp"),  # m5 has no EFA
        ("p3.16xlarge", "c5n.18xlarge", "tcp"),  # p3.16xlarge has no EFA
        ("p4d.24xlarge", "c5n.18xlarge", "tcp"),  # EFA between P4d/P5 and other families is not supported
        ("p4de.24xlarge", "c5n.18xlarge", "tcp"),
        ("p5.48xlarge", "c5n.18xlarge", "tcp"),
        ("p5en.48xlarge", "c5n.18xlarge", "tcp"),
    ],
)
def test_reducer_transport(worker: str, reducer: str, transport: str) -> None:
    cluster = spec(instance_type=worker, reducers="4", reducer_type=reducer, **V100_AMI)
    assert cluster.reducer_transport == transport
    expected_devices = catalog.get(reducer).efa_cards if transport == "efa" else 0
    assert layout.efa_device_count(cluster.reducer_interfaces) == expected_devices


def test_workers_over_tcp_mean_reducers_over_tcp() -> None:
    assert spec(instance_type="p3dn.24xlarge", efa="false", reducers="2", **V100_AMI).reducer_transport == "tcp"


# --- Storage ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [(None, 1200), ("1200", 1200), ("2400", 2400), ("9600", 9600)])
def test_fsx_capacity(given: str | None, expected: int) -> None:
    extra = {"fsx_capacity_gib": given} if given else {}
    assert spec(storage="fsx", **extra).fsx_capacity == expected
    assert spec().fsx_capacity is None


def test_beegfs_ram_disk_is_a_quarter_of_worker_memory_and_roles_name_every_node() -> None:
    beegfs = spec(instance_type="p3.16xlarge", storage="beegfs", reducers="2", reducer_type="m5.24xlarge", **V100_AMI)
    assert beegfs.beegfs is not None
    assert beegfs.beegfs["ramdisk_gib_per_node"] == 122  # 488 GiB x 0.25
    assert beegfs.beegfs["roles"] == {
        "management": ["worker:0"],
        "metadata": ["worker:0"],
        "storage": ["worker:*"],
        "client": ["worker:*", "reducer:*"],
    }
    assert spec(storage="beegfs").beegfs["roles"]["client"] == ["worker:*"]  # type: ignore[index]
    assert spec(storage="fsx").beegfs is None


# --- Bad input: one line naming the key, the value and what is allowed ----------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # The one node limit (infra.catalog.MAX_NODES) `launch plan` and `launch cost` say the same way, both sides.
        ({"nodes": "0"}, "nodes='0': allowed: 1 to 4096 worker nodes"),
        ({"nodes": "-3"}, "nodes='-3': allowed: 1 to 4096 worker nodes"),
        ({"nodes": "4097"}, "nodes='4097': allowed: 1 to 4096 worker nodes"),
        ({"nodes": "100000"}, "nodes='100000': allowed: 1 to 4096 worker nodes"),
        ({"reducers": "4097"}, "reducers='4097': allowed: 0 to 4096 reducer nodes"),
        ({"reducers": "-1"}, "reducers='-1': allowed: 0 to 4096 reducer nodes"),
        ({"instance_type": "p9.huge"}, "instance_type='p9.huge': not in the instance catalog; allowed: p3.2xlarge"),
        ({"instance_type": "c5n.18xlarge"}, "instance_type='c5n.18xlarge': has no GPUs; allowed: p3.2xlarge"),
        (
            {"instance_type": "p3.16xlarge", "efa": "true", **V100_AMI},
            "efa=True: p3.16xlarge has no EFA; allowed: false, or an instance_type with EFA: p3dn.24xlarge, p4d",
        ),
        (
            {"reducers": "2", "reducer_type": "p3.2xlarge"},
            "reducer_type='p3.2xlarge': has GPUs; reducers are CPU nodes, allowed: c5n.9xlarge, c5n.18xlarge, m5",
        ),
        ({"reducer_type": "g5.48xlarge"}, "reducer_type='g5.48xlarge': has GPUs; reducers are CPU nodes"),
        (
            {"storage": "fsx", "fsx_capacity_gib": "1000"},
            "fsx_capacity_gib='1000': allowed: 1200 or a multiple of 2400 GiB",
        ),
        (
            {"storage": "fsx", "fsx_capacity_gib": "3600"},
            "fsx_capacity_gib='3600': allowed: 1200 or a multiple of 2400",
        ),
        ({"storage": "fsx", "fsx_capacity_gib": "0"}, "fsx_capacity_gib='0': allowed: 1200 or a multiple of 2400"),
        ({"storage": "fsx", "fsx_capacity_gib": "big"}, "fsx_capacity_gib='big': input should be a valid integer"),
        ({"fsx_capacity_gib": "2400"}, "fsx_capacity_gib=2400: allowed only with storage=fsx"),
        ({"ttl_hours": "0"}, "ttl_hours='0': allowed: 0.25 to 720 hours; the launcher can extend it"),
        ({"ttl_hours": "-1"}, "ttl_hours='-1': allowed: 0.25 to 720 hours"),
        ({"ttl_hours": "nan"}, "ttl_hours='nan': allowed: 0.25 to 720 hours"),
        ({"ttl_hours": "never"}, "ttl_hours='never': input should be a valid number"),
        ({"ttl_hours": "0.1"}, "ttl_hours='0.1': allowed: 0.25 to 720 hours"),
        ({"ttl_hours": "1000"}, "ttl_hours='1000': allowed: 0.25 to 720 hours"),
        ({"storage": "nfs"}, "storage='nfs': input should be 'fsx', 'beegfs' or 'none'"),
        ({"data_bucket": "s3://my-data"}, "data_bucket='s3://my-data': allowed: an S3 bucket name"),
        ({"data_bucket": "My_Data"}, "data_bucket='My_Data': allowed: an S3 bucket name"),
        ({"data_bucket": "10.0.0.1"}, "data_bucket='10.0.0.1': allowed: an S3 bucket name"),
        ({"root_device": "/dev/sdb"}, "root_device='/dev/sdb': input should be '/dev/sda1' or '/dev/xvda'"),
        # The checkpoint bucket becomes an IAM resource ARN: a URI, a path or a name S3 refuses would grant nothing.
        ({"checkpoint_bucket": "s3://my-ckpts"}, "checkpoint_bucket='s3://my-ckpts': allowed: an S3 bucket name"),
        ({"checkpoint_bucket": "my-ckpts/run1"}, "checkpoint_bucket='my-ckpts/run1': allowed: an S3 bucket name"),
        ({"checkpoint_bucket": "ab"}, "checkpoint_bucket='ab': allowed: an S3 bucket name"),
        ({"checkpoint_bucket": "a..b"}, "checkpoint_bucket='a..b': allowed: an S3 bucket name"),
        ({"checkpoint_bucket": "192.168.5.4"}, "checkpoint_bucket='192.168.5.4': allowed: an S3 bucket name"),
        ({"checkpoint_bucket": "b", "checkpoint_prefix": "x"}, "checkpoint_bucket='b': allowed: an S3 bucket name"),
        # The prefix becomes part of arn:...:s3:::BUCKET/PREFIX/* and of the s3:prefix condition: IAM wildcards,
        # policy variables, empty or dot segments would widen or break the grant.
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "/runs"}, "checkpoint_prefix='/runs': allowed: "),
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "runs/"}, "checkpoint_prefix='runs/': allowed: "),
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "runs*"}, "checkpoint_prefix='runs*': allowed: "),
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "a//b"}, "checkpoint_prefix='a//b': allowed: "),
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "a/../b"}, "checkpoint_prefix='a/../b': allowed: "),
        ({"checkpoint_bucket": "my-ckpts", "checkpoint_prefix": "${aws:userid}"}, "checkpoint_prefix='${aws:userid}"),
        ({"checkpoint_prefix": "runs"}, "checkpoint_prefix='runs': allowed only with checkpoint_bucket"),
        # ssh_cidr is gone: the VPC has no internet gateway, so no rule could let anyone outside reach port 22.
        ({"ssh_cidr": "203.0.113.0/24"}, "ssh_cidr='203.0.113.0/24': removed: the cluster's VPC has no internet"),
        ({"ssh_cidr": "0.0.0.0/0"}, "ssh_cidr='0.0.0.0/0': removed:"),
        ({"az": "eu-west-1a"}, "az='eu-west-1a': allowed: an availability zone of region us-east-1"),
        ({"spot": "true", "capacity_reservation_id": CR, "az": "us-east-1a"}, "spot=True: allowed: false when"),
        # A reservation holds capacity in one zone: the stack's subnet must be there.
        ({"capacity_reservation_id": CR}, f"az: required with capacity_reservation_id='{CR}': the reservation holds"),
        ({"capacity_block": "true"}, "capacity_block=True: needs capacity_reservation_id=cr-..."),
        (
            {**BLOCK, "spot": "true"},
            "spot=True: allowed: false with capacity_block",
        ),
        (
            {**BLOCK, "instance_type": "g5.48xlarge"},
            "capacity_block=True: g5.48xlarge is not sold as Capacity Blocks; allowed: p4d.24xlarge, p5.48xlarge",
        ),
        (
            {**BLOCK, "placement_group": "pg"},
            "placement_group='pg': allowed: none with capacity_block",
        ),
        ({"capacity_block": "maybe"}, "capacity_block='maybe': input should be a valid boolean"),
        ({"root_volume_gib": "4"}, "root_volume_gib='4': allowed: 8 to 16384 GiB (gp3)"),
        ({"root_volume_gib": "20000"}, "root_volume_gib='20000': allowed: 8 to 16384 GiB"),
        ({"capacity_reservation_id": "cr-1"}, "capacity_reservation_id='cr-1': allowed: a capacity reservation id"),
        ({"placement_group": "a b"}, "placement_group='a b': allowed: a placement group name"),
        ({"cluster_name": "has_underscore"}, "cluster_name='has_underscore': allowed: a letter, then"),
        # Idle autostop decides on CloudWatch's 5-minute CPU periods: fewer than three is a guess.
        ({"idle_minutes": "5"}, "idle_minutes='5': allowed: 15 to 1440 minutes (CloudWatch reports the nodes' CPU"),
        ({"idle_minutes": "2000"}, "idle_minutes='2000': allowed: 15 to 1440 minutes"),
        ({"idle_minutes": "soon"}, "idle_minutes='soon': input should be a valid integer"),
        ({"idle_minutes": "90", "ttl_hours": "1"}, "idle_minutes=90: allowed: less than ttl_hours=1 (60 minutes)"),
    ],
)
def test_bad_context_gives_one_line_spec_error(override: dict[str, str], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_context({**BASE, **override})
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_context_strings_are_coerced_and_empty_strings_mean_not_given() -> None:
    cluster = spec(nodes="3", spot="false", reducers="2", ssh_cidr="", efa="", fsx_capacity_gib="", ttl_hours="1.5")
    assert (cluster.nodes, cluster.spot, cluster.reducers, cluster.efa) == (3, False, 2, None)
    assert cluster.ttl_hours == 1.5


def test_checkpoint_bucket_is_off_unless_given_and_its_prefix_defaults() -> None:
    assert (spec().checkpoint_bucket, spec(checkpoint_bucket="").checkpoint_bucket) == (None, None)
    given = spec(checkpoint_bucket="my-ckpts")
    assert (given.checkpoint_bucket, given.checkpoint_prefix) == ("my-ckpts", "scaletrain-checkpoints")
    assert given.checkpoint_location == "s3://my-ckpts/scaletrain-checkpoints"
    nested = spec(checkpoint_bucket="my.ckpts-1", checkpoint_prefix="team_a/resnet-50.v2")
    assert nested.checkpoint_location == "s3://my.ckpts-1/team_a/resnet-50.v2"
    assert spec().checkpoint_location is None


def test_idle_minutes_is_off_unless_given() -> None:
    assert spec().idle_minutes is None and spec(idle_minutes="").idle_minutes is None
    assert spec(idle_minutes="60").idle_minutes == 60


def test_removed_keys_are_not_keys_of_the_spec() -> None:
    assert set(REMOVED_KEYS) == {"ssh_cidr"} and not set(REMOVED_KEYS) & set(CONTEXT_KEYS)
    assert "SSM Session Manager" in REMOVED_KEYS["ssh_cidr"]


# --- The node image ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [t.name for t in catalog.gpu_types()])
def test_every_gpu_type_deploys_without_ami_on_the_image_its_gpus_need(name: str) -> None:
    """No type needs -c ami any more: V100s resolve the image built with NVIDIA's proprietary kernel modules (the
    open ones do not drive Volta), every other type the default build."""
    cluster = spec(instance_type=name)
    proprietary = catalog.get(name).gpu_model in ("V100", "V100-32GB")
    assert cluster.nvidia_kernel_modules == ("proprietary" if proprietary else "open")
    expected = paths.IMAGE_ID_PARAMETER_PROPRIETARY if proprietary else paths.IMAGE_ID_PARAMETER
    assert cluster.image_parameter == expected
    assert cluster.image_build_command.startswith('npx cdk deploy --app ".venv/bin/python ami/app.py" -c region=')
    assert cluster.image_build_command.endswith("-c nvidia_kernel_modules=proprietary") == proprietary


def test_an_ami_overrides_the_project_image() -> None:
    assert spec(instance_type="p3.16xlarge", **V100_AMI).image_parameter is None


def test_root_volume_against_the_image_snapshot() -> None:
    assert spec().root_volume_problem(2000) is None  # the image's own size, whatever it is
    assert spec(root_volume_gib="300").root_volume_problem(200) is None
    problem = spec(root_volume_gib="100").root_volume_problem(200)
    assert problem is not None and problem.startswith("root_volume_gib=100: the image's root snapshot is 200 GiB")


# --- Capacity reservations and Capacity Blocks ----------------------------------------------------------------


def test_a_reservation_with_its_zone_and_a_capacity_block() -> None:
    reserved = spec(capacity_reservation_id=CR, az="us-east-1d")
    assert (reserved.capacity_block, reserved.placement) == (False, "new")
    block = spec(instance_type="p5.48xlarge", capacity_reservation_id=CR, az="us-east-1a", capacity_block="true")
    assert (block.capacity_block, block.placement) == (True, "none")
    assert spec(capacity_reservation_id=CR, az="us-east-1d", placement_group="mine").placement == "given"
    assert set(catalog.names()) >= CAPACITY_BLOCK_TYPES


def test_every_context_key_is_documented() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "infra" / "README.md").read_text()
    assert [key for key in CONTEXT_KEYS if f"| `{key}` |" not in readme] == []
