"""Fan-out of `launch exec`: `sleep 1` on 16 local nodes at once, against 16 runs on one node.

Baseline and candidate run in the same process on the same cluster. Prints `ratio=` last:
(time of 16 sequential one-node runs) / (time of one 16-node run); 16 is the ideal.

    .venv/bin/python bench/fanout.py [--nodes 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-") as home:
        os.environ["SCALETRAIN_HOME"] = home
        from launcher.execute import remote
        from launcher.local import backend as local

        cluster = local.up(args.nodes)
        try:
            remote.run_all(cluster, cluster.nodes, "true")  # warm up: first connections, host key loads
            parallel, sequential = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                results = remote.run_all(cluster, cluster.nodes, "sleep 1")
                parallel.append(time.perf_counter() - t)
                assert all(r.ok for r in results), results
                t = time.perf_counter()
                for _ in range(args.nodes):
                    assert remote.run_all(cluster, cluster.nodes[:1], "sleep 1")[0].ok
                sequential.append(time.perf_counter() - t)
        finally:
            local.down(cluster)
    par, seq = statistics.median(parallel), statistics.median(sequential)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.nodes} local sshd nodes, "
          f"median of {args.repeat}")
    print(f"exec 'sleep 1' on {args.nodes} nodes at once: {par:.2f} s")
    print(f"exec 'sleep 1' on 1 node, {args.nodes} times:  {seq:.2f} s")
    print(f"ratio={seq / par:.2f}")


if __name__ == "__main__":
    main()
