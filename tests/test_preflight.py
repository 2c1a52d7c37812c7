"""`launch preflight`'s decisions, from plain facts (what the shell reads from AWS): each check fails for the reason
the real deployment would, names the fix in one line, and passes when the account is ready."""

from __future__ import annotations

import datetime as dt

import pytest

from ami.paths import IMAGE_ID_PARAMETER
from infra import catalog
from infra.spec import ClusterSpec
from launcher.plans import preflight
from launcher.plans.preflight import Facts, ImageFacts, Quota, Unread

NOW = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
EVERYWHERE = frozenset(ZONES)
IMAGE = {"ImageId": "ami-0123456789abcdef0", "State": "available", "Architecture": "x86_64",
         "PlatformDetails": "Linux/UNIX", "Name": "scaletrain-ubuntu-22.04", "RootDeviceName": "/dev/sda1",
         "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 300, "SnapshotId": "snap-1"}}]}
P_OD, P_SPOT, STD_OD = "L-417A185B", "L-7212CCBC", "L-1216C47A"


def spec(**context) -> ClusterSpec:
    return ClusterSpec.from_context({"cluster_name": "c1", "instance_type": "p4d.24xlarge", "nodes": 8, **context})


def facts(**kw) -> Facts:
    base = dict(region="us-east-1", zones=ZONES,
                offered={"p4d.24xlarge": EVERYWHERE, "p5en.48xlarge": frozenset({"us-east-1a", "us-east-1c"}),
                         "p4de.24xlarge": frozenset({"us-east-1b", "us-east-1c"}),
                         "c5n.18xlarge": frozenset({"us-east-1a", "us-east-1b", "us-east-1d"}),
                         "m5.large": EVERYWHERE},
                quotas={P_OD: Quota(P_OD, "Running On-Demand P instances", 1536, 0),
                        P_SPOT: Quota(P_SPOT, "All P Spot Instance Requests", 1536, 0),
                        STD_OD: Quota(STD_OD, "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 1000,
                                      0)},
                image=ImageFacts(ami=IMAGE["ImageId"], parameter=IMAGE_ID_PARAMETER, image=IMAGE), now=NOW)
    return Facts(**{**base, **kw})


def lines(verdicts, check, status=None):
    return [v.line for v in verdicts if v.check == check and (status is None or v.status == status)]


def test_a_ready_account_passes_every_check():
    verdicts = preflight.decide(spec(az="us-east-1a"), facts())
    assert not preflight.failed(verdicts), preflight.render(verdicts)
    assert {v.check for v in verdicts} == {"offering", "quota", "image", "ssm-plugin"}


def test_without_the_session_manager_plugin_preflight_fails_in_one_line_naming_the_install_page():
    """Every SSH to a node runs `aws ssm start-session`, which needs the plugin: without it the first SSH would fail
    after the stack is paid for (issue 37 item 4)."""
    import dataclasses

    verdicts = preflight.decide(spec(az="us-east-1a"), dataclasses.replace(facts(), ssm_plugin=None))
    [line] = lines(verdicts, "ssm-plugin", "FAIL")
    assert line == ("the AWS CLI's Session Manager plugin (session-manager-plugin) is not on PATH, and every SSH to "
                    "a node goes through SSM Session Manager: install it as https://docs.aws.amazon.com/"
                    "systems-manager/latest/userguide/session-manager-working-with-install-plugin.html says")
    assert preflight.failed(verdicts)
    found = preflight.decide(spec(az="us-east-1a"), dataclasses.replace(facts(), ssm_plugin="/usr/local/bin/s-m-p"))
    assert lines(found, "ssm-plugin", "ok") == ["Session Manager plugin: /usr/local/bin/s-m-p"]


# --- offering ------------------------------------------------------------------------------------------------

def test_a_type_not_offered_in_the_chosen_az_fails_and_names_an_az_that_has_it():
    verdicts = preflight.check_offerings(spec(instance_type="p5en.48xlarge", az="us-east-1b"), facts())
    [line] = lines(verdicts, "offering", "FAIL")
    assert "p5en.48xlarge (workers) is not offered in us-east-1b" in line
    assert line.endswith("pass -c az=us-east-1a (AZs that offer p5en.48xlarge and m5.large: us-east-1a, us-east-1c)")


def test_without_az_a_type_missing_from_some_az_fails_since_the_stack_takes_the_first_az_getazs_lists():
    s = spec(instance_type="p5en.48xlarge")
    [line] = lines(preflight.check_offerings(s, facts()), "offering", "FAIL")
    assert "offered only in us-east-1a, us-east-1c of us-east-1" in line and "pass -c az=us-east-1a" in line
    ok = preflight.check_offerings(s, facts(offered={"p5en.48xlarge": EVERYWHERE, "m5.large": EVERYWHERE}))
    assert [v.status for v in ok] == ["ok", "ok"] and "every AZ of us-east-1" in ok[0].line


def test_workers_and_reducers_must_share_an_az_and_the_suggestion_offers_both():
    s = spec(instance_type="p4de.24xlarge", reducers=2, reducer_type="c5n.18xlarge", az="us-east-1a")
    verdicts = preflight.check_offerings(s, facts())
    [line] = lines(verdicts, "offering", "FAIL")
    assert line.startswith("p4de.24xlarge (workers) is not offered in us-east-1a")
    assert "pass -c az=us-east-1b (AZs that offer p4de.24xlarge and c5n.18xlarge and m5.large: us-east-1b)" in line
    assert lines(verdicts, "offering", "ok") == ["c5n.18xlarge (reducers) is offered in us-east-1a",
                                                 "m5.large (head) is offered in us-east-1a"]


def test_no_az_offering_every_type_says_to_change_types_or_region():
    s = spec(instance_type="p5en.48xlarge", reducers=1, az="us-east-1a")
    f = facts(offered={"p5en.48xlarge": frozenset({"us-east-1a"}), "c5n.18xlarge": frozenset({"us-east-1b"}),
                       "m5.large": EVERYWHERE})
    [line] = lines(preflight.check_offerings(s, f), "offering", "FAIL")
    assert "no AZ of us-east-1 offers p5en.48xlarge and c5n.18xlarge and m5.large" in line and "-c region" in line


def test_a_type_the_region_does_not_offer_at_all_fails():
    [line] = lines(preflight.check_offerings(spec(instance_type="p5.48xlarge", az="us-east-1a"), facts()),
                   "offering", "FAIL")
    assert line.startswith("p5.48xlarge (workers) is offered in no AZ of us-east-1")


def test_the_suggested_az_is_the_reservations_when_it_offers_every_type():
    s = spec(instance_type="p5en.48xlarge", capacity_reservation_id="cr-0123456789abcdef0", az="us-east-1b")
    f = facts(reservation=reservation(InstanceType="p5en.48xlarge", AvailabilityZone="us-east-1c"))
    assert "pass -c az=us-east-1c" in lines(preflight.check_offerings(s, f), "offering", "FAIL")[0]


def test_offerings_that_could_not_be_read_are_skipped_not_passed():
    [v] = preflight.check_offerings(spec(), facts(offered=Unread("UnauthorizedOperation: no")))
    assert v.status == "skip" and "UnauthorizedOperation" in v.line


# --- quota ---------------------------------------------------------------------------------------------------

def test_a_quota_below_nodes_times_vcpus_fails_with_the_value_to_request():
    f = facts(quotas={P_OD: Quota(P_OD, "Running On-Demand P instances", 384, 96)})
    [line] = lines(preflight.check_quotas(spec(), f), "quota", "FAIL")
    assert "Running On-Demand P instances (L-417A185B) is 384 vCPUs in us-east-1 (96 in use)" in line
    assert "the stack needs 768 (workers: 8 x p4d.24xlarge x 96)" in line
    assert "--service-code ec2 --quota-code L-417A185B --desired-value 864" in line


def test_a_quota_that_covers_the_nodes_passes_and_says_whether_usage_was_subtracted():
    f = facts(quotas={P_OD: Quota(P_OD, "Running On-Demand P instances", 768, None)})
    v, _head = preflight.check_quotas(spec(), f)  # the head node's standard quota is the second line
    assert v.status == "ok" and "768 vCPUs needed" in v.line and "not subtracted" in v.line
    f = facts(quotas={P_OD: Quota(P_OD, "Running On-Demand P instances", 768, 1)})
    assert preflight.check_quotas(spec(), f)[0].status == "FAIL"  # one vCPU already in use


def test_spot_nodes_draw_on_the_spot_quota_and_reducers_on_the_standard_one():
    s = spec(spot=True, reducers=4, reducer_type="c5n.18xlarge")
    assert preflight.quota_codes(s) == [P_SPOT, "L-34B43A08", STD_OD]  # the head node is on-demand, spot or not
    s = spec(reducers=4, reducer_type="c5n.18xlarge")
    f = facts(quotas={**facts().quotas, STD_OD: Quota(STD_OD, "Standard", 256, 0)})
    [line] = lines(preflight.check_quotas(s, f), "quota", "FAIL")
    assert "(L-1216C47A)" in line and "needs 290 (reducers: 4 x c5n.18xlarge x 72 + head: 1 x m5.large x 2)" in line


def test_the_head_node_draws_on_the_on_demand_standard_quota_at_its_boundary():
    """Every stack launches its Slurm head node (infra/head.py: one on-demand m5.large, 2 vCPUs, spot workers or not),
    which draws on Running On-Demand Standard instances
    (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html: M is a standard family)."""
    assert preflight.quota_codes(spec()) == [P_OD, STD_OD]
    assert preflight.quota_codes(spec(spot=True)) == [P_SPOT, STD_OD]
    one_free = facts(quotas={**facts().quotas, STD_OD: Quota(STD_OD, "Standard", 3, 2)})
    [line] = lines(preflight.check_quotas(spec(), one_free), "quota", "FAIL")
    assert "the stack needs 2 (head: 1 x m5.large x 2)" in line and "--desired-value 4" in line
    two_free = facts(quotas={**facts().quotas, STD_OD: Quota(STD_OD, "Standard", 4, 2)})
    assert lines(preflight.check_quotas(spec(), two_free), "quota", "FAIL") == []
    # c5n reducers draw on the same quota: the two add up.
    s = spec(reducers=4, reducer_type="c5n.18xlarge", az="us-east-1a")
    f = facts(quotas={**facts().quotas, STD_OD: Quota(STD_OD, "Standard", 289, 0)})
    [line] = lines(preflight.check_quotas(s, f), "quota", "FAIL")
    assert "needs 290 (reducers: 4 x c5n.18xlarge x 72 + head: 1 x m5.large x 2)" in line


def test_the_head_nodes_type_must_be_offered_in_the_stacks_az():
    f = facts(offered={**facts().offered, "m5.large": frozenset({"us-east-1b"})})
    [line] = lines(preflight.check_offerings(spec(az="us-east-1a"), f), "offering", "FAIL")
    assert "m5.large (head) is not offered in us-east-1a" in line


def test_workers_in_a_reservation_are_not_counted_against_the_quota():
    s = spec(capacity_reservation_id="cr-0123456789abcdef0", az="us-east-1a")
    assert preflight.quota_codes(s) == [STD_OD]  # the head node's only
    f = facts(quotas={**facts().quotas, P_OD: Quota(P_OD, "Running On-Demand P instances", 0, 0)})
    assert [v.status for v in preflight.check_quotas(s, f)] == ["ok", "ok"]


def test_a_quota_that_could_not_be_read_is_skipped_with_the_need():
    denied = facts(quotas={**facts().quotas, P_OD: Unread("AccessDeniedException: no")})
    verdicts = preflight.check_quotas(spec(), denied)
    v, head = verdicts
    assert head.status == "ok"
    assert v.status == "skip" and "768 vCPUs" in v.line and "AccessDeniedException" in v.line
    assert "(1 could not be made: see 'skip' above)" in preflight.summary(spec(), verdicts, [])


def test_every_catalog_type_has_a_quota_class():
    for name in catalog.names():
        qc = preflight.quota_class(catalog.get(name))
        assert qc.on_demand[0].startswith("L-") and qc.spot[0].startswith("L-")
    assert preflight.quota_class(catalog.get("g5.48xlarge")).on_demand[0] == "L-DB2E81BA"


# --- reservation ---------------------------------------------------------------------------------------------

CR = "cr-0123456789abcdef0"


def reservation(**kw):
    return {"CapacityReservationId": CR, "InstanceType": "p4d.24xlarge", "AvailabilityZone": "us-east-1a",
            "Tenancy": "default", "InstancePlatform": "Linux/UNIX", "State": "active", "TotalInstanceCount": 8,
            "AvailableInstanceCount": 8, "ReservationType": "default", "InstanceMatchCriteria": "targeted", **kw}


def check_reservation(r, **context):
    s = spec(**{"capacity_reservation_id": CR, "az": "us-east-1a", **context})
    return preflight.check_reservation(s, facts(reservation=r))


def test_a_matching_active_reservation_passes():
    [v] = check_reservation(reservation())
    assert v.status == "ok" and "p4d.24xlarge in us-east-1a, active, room for 8 of 8 workers" in v.line


@pytest.mark.parametrize(("change", "context", "fix"), [
    ({"InstanceType": "p5.48xlarge"}, {}, "reserves p5.48xlarge, the workers are p4d.24xlarge: pass -c "
                                          "instance_type=p5.48xlarge"),
    ({"AvailabilityZone": "us-east-1c"}, {}, "is in us-east-1c, the stack in us-east-1a: pass -c az=us-east-1c"),
    ({"Tenancy": "dedicated"}, {}, "has dedicated tenancy"),
    ({"InstancePlatform": "Windows"}, {}, "is for Windows"),
    ({"State": "expired"}, {}, "is expired: nothing can launch into it"),
    ({"AvailableInstanceCount": 6}, {}, "has room for 6 of the 8 workers (8 reserved): pass -c nodes=6"),
    ({"PlacementGroupArn": "arn:aws:ec2:us-east-1:123456789012:placement-group/hpc"}, {},
     "is in cluster placement group hpc: pass -c placement_group=hpc"),
])
def test_a_reservation_the_stack_cannot_launch_into_fails_naming_the_fix(change, context, fix):
    verdicts = check_reservation(reservation(**change), **context)
    fails = lines(verdicts, "reservation", "FAIL")
    assert fails == [f"{CR}: {fix}"] or (len(fails) == 1 and fix in fails[0]), fails
    assert not lines(verdicts, "reservation", "ok")


def test_a_reservation_in_the_placement_group_the_stack_uses_passes():
    r = reservation(PlacementGroupArn="arn:aws:ec2:us-east-1:123456789012:placement-group/hpc")
    assert [v.status for v in check_reservation(r, placement_group="hpc")] == ["ok"]


def test_a_missing_reservation_fails():
    [v] = check_reservation(None)
    assert v.status == "FAIL" and f"capacity reservation {CR} does not exist in us-east-1" in v.line


def test_a_capacity_block_needs_the_capacity_block_market_type():
    block = reservation(ReservationType="capacity-block", EndDate=NOW + dt.timedelta(days=2))
    [line] = lines(check_reservation(block), "reservation", "FAIL")
    assert "is a Capacity Block" in line and "capacity-block market type" in line
    assert line.endswith("pass -c capacity_block=true")
    assert [v.status for v in check_reservation(block, capacity_block=True)] == ["ok"]
    [line] = lines(check_reservation(reservation(), capacity_block=True), "reservation", "FAIL")
    assert "not a Capacity Block: drop -c capacity_block" in line


def test_a_scheduled_capacity_block_and_one_ending_before_the_ttl_warn():
    block = reservation(ReservationType="capacity-block", State="scheduled", AvailableInstanceCount=0,
                        StartDate=NOW + dt.timedelta(hours=3), EndDate=NOW + dt.timedelta(hours=20))
    verdicts = check_reservation(block, capacity_block=True, ttl_hours=24)
    assert not preflight.failed(verdicts)
    warns = lines(verdicts, "reservation", "warn")
    assert any("is scheduled until 2030-01-01 15:00 UTC" in w for w in warns)
    assert any("ends 2030-01-02 08:00 UTC" in w and "terminating its instances 30 minutes earlier" in w for w in warns)
    assert not lines(check_reservation(block, capacity_block=True, ttl_hours=12), "reservation", "warn")[1:]


# --- image ---------------------------------------------------------------------------------------------------

def test_no_published_image_fails_with_the_command_that_builds_it():
    [v] = preflight.check_image(spec(), facts(image=ImageFacts(ami=None, parameter=IMAGE_ID_PARAMETER)))
    assert v.status == "FAIL"
    assert v.line == (f'no training image in us-east-1 (SSM parameter {IMAGE_ID_PARAMETER} is missing): build it once '
                      'with `npx cdk deploy --app ".venv/bin/python ami/app.py" -c region=us-east-1` (or pass -c ami=)')


def test_a_published_image_that_is_gone_fails_and_an_available_one_passes():
    gone = ImageFacts(ami="ami-0123456789abcdef0", parameter=IMAGE_ID_PARAMETER, image=None)
    [v] = preflight.check_image(spec(), facts(image=gone))
    assert v.status == "FAIL" and f"SSM parameter {IMAGE_ID_PARAMETER}" in v.line and "build it again" in v.line
    [v] = preflight.check_image(spec(), facts())
    assert v.status == "ok" and "ami-0123456789abcdef0" in v.line and "300 GiB root" in v.line


@pytest.mark.parametrize(("image", "fragment"), [
    (None, "does not exist in us-east-1: AMIs are regional"),
    ({**IMAGE, "State": "failed"}, "is failed, not available"),
    ({**IMAGE, "Architecture": "arm64"}, "is arm64; p4d.24xlarge runs x86_64 images"),
    ({**IMAGE, "RootDeviceName": "/dev/xvda"}, "has root device /dev/xvda, the launch template maps /dev/sda1: pass "
                                               "-c root_device=/dev/xvda"),
])
def test_an_ami_from_context_that_cannot_launch_fails(image, fragment):
    f = facts(image=ImageFacts(ami="ami-0123456789abcdef0", parameter=None, image=image))
    [v] = preflight.check_image(spec(ami="ami-0123456789abcdef0"), f)
    assert v.status == "FAIL" and "(-c ami)" in v.line and fragment in v.line


def test_a_root_volume_smaller_than_the_images_snapshot_fails():
    [v] = preflight.check_image(spec(root_volume_gib=200), facts())
    assert v.status == "FAIL" and "root_volume_gib=200: the image's root snapshot is 300 GiB" in v.line
    assert preflight.check_image(spec(root_volume_gib=300), facts())[0].status == "ok"


def test_a_v100_cluster_looks_for_the_image_with_nvidias_proprietary_modules():
    s = spec(instance_type="p3dn.24xlarge")
    [v] = preflight.check_image(s, facts(image=ImageFacts(ami=None, parameter=s.image_parameter)))
    assert s.image_parameter != IMAGE_ID_PARAMETER and s.image_parameter in v.line
    assert "-c nvidia_kernel_modules=proprietary" in v.line


# --- Capacity Block offerings (a hint) -----------------------------------------------------------------------

@pytest.mark.parametrize(("ttl", "hours"), [(0.25, 24), (24, 24), (25, 48), (14 * 24, 336), (15 * 24, 504),
                                            (720, 840)])
def test_block_duration_covers_the_ttl_in_the_increments_aws_sells(ttl, hours):
    assert preflight.block_duration_hours(ttl) == hours


def test_capacity_block_offerings_are_a_hint_for_p5_without_a_reservation():
    s = spec(instance_type="p5.48xlarge", az="us-east-1a")
    assert preflight.wants_block_offerings(s)
    assert not preflight.wants_block_offerings(spec(instance_type="p5.48xlarge", spot=True))
    assert not preflight.wants_block_offerings(spec(instance_type="g5.48xlarge"))
    offer = {"CapacityBlockOfferingId": "cb-0123456789abcdef0", "InstanceType": "p5.48xlarge",
             "AvailabilityZone": "us-east-1b", "InstanceCount": 8, "StartDate": NOW + dt.timedelta(days=1),
             "EndDate": NOW + dt.timedelta(days=2), "CapacityBlockDurationHours": 24, "UpfrontFee": "2500.00",
             "CurrencyCode": "USD"}
    [v] = preflight.hint_blocks(s, facts(block_offerings=[offer]))
    assert v.status == "info" and "earliest in us-east-1b from 2030-01-02 12:00 UTC for USD 2500.00" in v.line
    assert "-c az=us-east-1b" in v.line and "cb-0123456789abcdef0" in v.line
    assert preflight.hint_blocks(s, facts(block_offerings=[]))[0].status == "info"


# --- context, output ------------------------------------------------------------------------------------------

def test_context_is_cdk_json_overlaid_with_c_pairs_and_unknown_keys_are_refused():
    ctx = preflight.context_from_args(["nodes=4", "az=us-east-1b"], {"nodes": 2, "cluster_name": "x",
                                                                      "@aws-cdk/core:flag": True})
    assert ctx["nodes"] == "4" and ctx["az"] == "us-east-1b" and ctx["cluster_name"] == "x"
    with pytest.raises(ValueError, match="unknown context key 'node'; allowed: cluster_name"):
        preflight.context_from_args(["node=4"])
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        preflight.context_from_args(["nodes"])
    with pytest.raises(ValueError, match="^ssh_cidr='0.0.0.0/0': removed"):
        preflight.spec_from_context(preflight.context_from_args(["ssh_cidr=0.0.0.0/0"], {"cluster_name": "c"}))
    with pytest.raises(ValueError, match="^nodes='x'"):
        preflight.spec_from_context({"cluster_name": "c", "instance_type": "p4d.24xlarge", "nodes": "x"})


def test_render_and_summary_read_as_one_line_each():
    verdicts = preflight.decide(spec(instance_type="p5en.48xlarge"), facts())
    out = preflight.render(verdicts)
    assert out[0].startswith("FAIL  offering ") and all("\n" not in line for line in out)
    assert preflight.summary(spec(), verdicts, []).startswith("preflight: 1 of 6 checks fail")
    ok = preflight.decide(spec(), facts())
    assert preflight.summary(spec(), ok, ["nodes=8"]).endswith("deploy with `npx cdk deploy -c nodes=8`")
