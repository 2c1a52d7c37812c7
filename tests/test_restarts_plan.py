"""A restart that no step recorded (launcher/plans/restarts.py: unrecorded_loss)."""


def test_a_restart_whose_step_died_with_its_batch_node_is_recorded_by_the_next_attempt():
    from launcher.plans.restarts import unrecorded_loss

    # attempt 2 finds no record of restart 1: its predecessor's step was on node1, which was lost
    got = unrecorded_loss([], 1, "node1", 0)
    assert got is not None and got.attempt == 1 and got.lost == ["node1"] and got.resumed_from_epoch == 1
    assert "batch node node1 was lost" in got.why
    # the step itself recorded it (its batch node survived): nothing to add; and a first attempt has nothing
    assert unrecorded_loss([{"attempt": 1}], 1, "node0", 0) is None
    assert unrecorded_loss([], 0, None, None) is None
    # a second such loss after one recorded restart
    again = unrecorded_loss([{"attempt": 1}], 2, "node0", None)
    assert again is not None and again.attempt == 2 and again.resumed_from_epoch == 0
