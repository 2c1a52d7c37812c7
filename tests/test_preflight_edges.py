"""Preflight's decisions at their boundaries, on both sides: a wrong answer here costs money (a stack that cannot
launch its last worker, or a Capacity Block that terminates the nodes before the TTL), so a change that moves any
boundary by one must fail a test here."""

from __future__ import annotations

import datetime as dt

import pytest
from test_preflight import CR, NOW, check_reservation, lines, reservation

from launcher.plans import preflight

# --- a capacity reservation's room: every worker, or fail ------------------------------------------------------

@pytest.mark.parametrize(("state", "room_field"), [("active", "AvailableInstanceCount"),
                                                    ("scheduled", "TotalInstanceCount")])
def test_a_reservation_with_room_for_7_of_8_workers_fails_and_8_of_8_passes(state, room_field):
    # Active: AvailableInstanceCount is what is left to launch into; scheduled: it reads 0 until the start, and
    # TotalInstanceCount is what there will be.
    seven = reservation(**{"State": state, "TotalInstanceCount": 8, "AvailableInstanceCount": 0, room_field: 7})
    fails = lines(check_reservation(seven), "reservation", "FAIL")
    assert fails == [f"{CR}: has room for 7 of the 8 workers ({seven['TotalInstanceCount']} reserved): pass "
                     f"-c nodes=7 or enlarge the reservation"]
    eight = reservation(**{"State": state, "TotalInstanceCount": 8, "AvailableInstanceCount": 0, room_field: 8})
    verdicts = check_reservation(eight)
    assert not preflight.failed(verdicts)
    assert any("room for 8 of 8 workers" in line for line in lines(verdicts, "reservation", "ok"))


# --- a Capacity Block that ends soon after the TTL -------------------------------------------------------------

@pytest.mark.parametrize(("after_ttl_min", "warns"), [(29, True), (30, False), (31, False)])
def test_a_capacity_block_warns_when_its_termination_starts_before_the_ttl_ends(after_ttl_min, warns):
    # "Thirty minutes before the reservation expires, we begin to terminate any instances that are still running in
    # the Capacity Block" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html): a block
    # ending 30 minutes after the TTL starts terminating exactly when the stack deletes itself; 29, a minute early.
    ttl_hours = 24
    end = NOW + dt.timedelta(hours=ttl_hours, minutes=after_ttl_min)
    block = reservation(ReservationType="capacity-block", EndDate=end)
    verdicts = check_reservation(block, capacity_block=True, ttl_hours=ttl_hours)
    assert not preflight.failed(verdicts)
    warned = [w for w in lines(verdicts, "reservation", "warn") if "terminating its instances 30 minutes earlier" in w]
    assert bool(warned) is warns, verdicts


# --- idle_minutes against the TTL --------------------------------------------------------------------------------

def test_idle_minutes_equal_to_the_ttl_is_refused_and_one_less_is_accepted():
    # The TTL deletes the stack at ttl_hours; an idle stop that could only fire then or later never fires.
    base = {"cluster_name": "c1", "instance_type": "p4d.24xlarge", "nodes": 8, "ttl_hours": "1"}
    with pytest.raises(ValueError, match=r"^idle_minutes=60: allowed: less than ttl_hours=1 \(60 minutes\)"):
        preflight.spec_from_context({**base, "idle_minutes": "60"})
    assert preflight.spec_from_context({**base, "idle_minutes": "59"}).idle_minutes == 59
