"""launch train --max-restarts: the pure decisions (launcher/plans/restarts.py)."""

from __future__ import annotations

import json

from launcher.plans import restarts

LOST_DAEMON = ["[node0] ORTE has lost communication with a remote daemon.",
               "[node0]   HNP daemon   : [[51713,0],0] on node node0",
               "[node0]   Remote daemon: [[51713,0],1] on node node1"]
STEPS = ["[node0] training resnet18 on 2 rank(s) (horovod), 10 classes, 31 steps/epoch, global batch 32",
         "[node0] epoch 0 step 10 lr 0.006 loss 1.7 31 img/s",
         "[node0] epoch 1 step 40 lr 0.006 loss 1.0 50 img/s"]


def decide(lost=("node1",), *, trainer_error=False, done=0, limit=1, previous=None, progressed=True):
    return restarts.decide("node node1 stopped answering", tuple(lost), trainer_error=trainer_error,
                           restarts_done=done, max_restarts=limit, previous_lost=previous, progressed=progressed)


def test_a_lost_node_is_restarted_within_the_limit():
    assert decide().retry
    assert decide(done=1, limit=3).retry


def test_a_failure_the_trainer_names_or_without_a_lost_node_is_not_retried():
    assert not decide(trainer_error=True).retry
    v = decide(lost=())
    assert not v.retry and "no node was lost" in v.why


def test_the_limit_and_zero_are_said():
    assert "after 1 restart(s), the limit (--max-restarts 1)" in decide(done=1, limit=1).why
    assert "--max-restarts is 0" in decide(limit=0).why


def test_the_same_node_failing_again_before_any_progress_is_not_retried():
    v = decide(done=1, limit=5, previous=["node1"], progressed=False)
    assert not v.retry and "failed again before the run made progress" in v.why
    assert decide(done=1, limit=5, previous=["node1"], progressed=True).retry
    assert decide(done=1, limit=5, previous=["node0"], progressed=False).retry


def test_lost_nodes_come_from_ssh_and_from_mpiruns_own_words():
    assert restarts.lost_nodes(LOST_DAEMON, {}, ["node0", "node1"]) == ("node1",)
    assert restarts.lost_nodes([], {"node0": "timed out"}, ["node0", "node1"]) == ("node0",)
    assert restarts.lost_nodes(["Remote daemon: [[1,0],1] on node elsewhere"], {}, ["node0"]) == ()


def test_the_trainers_own_error_line_is_recognised():
    assert restarts.trainer_error(["[node0] error: shard train-000003.tar is corrupt"])
    assert not restarts.trainer_error(LOST_DAEMON)


def test_work_lost_runs_from_the_resume_point_to_the_last_step_printed():
    at = restarts.progress(STEPS)
    assert at == (1, 40, 31)
    assert restarts.work_lost(at, 0) == round(40 / 31 - 1, 3)      # resumed at epoch 1
    assert restarts.work_lost(at, None) == round(40 / 31, 3)       # no checkpoint: from the start
    assert restarts.work_lost(None, None) == 0.0
    assert restarts.progress(["no steps yet"]) is None


def test_the_record_says_how_many_restarts_and_what_each_lost():
    r = restarts.Restart(attempt=1, why="node node1 stopped answering", lost=["node1"], resumed_from_epoch=1,
                         epochs_lost=0.29, progress=[1, 40, 31])
    data = json.loads(restarts.record([r, r]))
    assert data["restarts"] == 2 and data["epochs_lost"] == 0.58
    assert data["history"][0]["lost"] == ["node1"] and data["history"][0]["resumed_from_epoch"] == 1
