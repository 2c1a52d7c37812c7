"""Two `launch local up`s at once take two subnets (issue 45 item 2): the subnet is chosen and the bridge that holds
it made under one lock for the machine (launcher/local/rehearsal_nodes.claim_network). The race is forced: each
claim waits after choosing, before its bridge exists; without the lock both choose 10.213.0.0/24 and they
collide, which the second case shows happens.

Each run is in a network and mount namespace of its own with its own /run (unshare(1)): its bridges and its lock go
with it, and nothing of this machine's is touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CLAIMS = '''
import fcntl, json, sys, threading, time
from launcher.errors import LaunchError
from launcher.local import rehearsal_nodes as nodes
from launcher.plans import rehearsal as plan

if sys.argv[1] == "no-lock":
    fcntl.flock = lambda *a: None
chosen = plan.free_subnet
def slow_choice(routes):
    subnet = chosen(routes)
    time.sleep(0.5)          # the other `up` chooses meanwhile
    return subnet
plan.free_subnet = slow_choice

out = {}
def claim(key):
    try:
        out[key] = nodes.claim_network(key, ["node0", "node1"], None).subnet
    except LaunchError as e:
        out[key] = "error: " + str(e)
threads = [threading.Thread(target=claim, args=(f"/clusters/{k}",)) for k in ("a", "b")]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
'''


def claims(mode: str) -> dict[str, str]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and ip(8): a bridge of its own")
    argv = ["unshare", "--net", "--mount", "--", "bash", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "private",
            sys.executable, "-c", CLAIMS, mode]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_two_clusters_coming_up_at_once_take_two_subnets() -> None:
    got = claims("locked")
    assert sorted(got.values()) == ["10.213.0.0/24", "10.213.1.0/24"], got


def test_without_the_lock_the_forced_race_is_lost() -> None:
    """The case above can fail: the same two claims, the lock a no-op, collide on the first subnet: both bridges
    given 10.213.0.0/24 (both overlap checks ran before either bridge held it: two clusters answering one address
    range), or the second refused with the overlap line naming a --subnet it was not given."""
    got = claims("no-lock")
    values = sorted(got.values())
    collided = values == ["10.213.0.0/24", "10.213.0.0/24"]
    refused = values[0] == "10.213.0.0/24" and values[1].startswith("error: --subnet 10.213.0.0/24 overlaps")
    assert collided or refused, got
