#!/usr/bin/env bash
# `make demo`: the whole job on a local 2-node cluster of rehearsal nodes: each its own network namespace, address,
# hostname and root built by the image recipe (ami/components), sharing only /fsx, as the stack's nodes share FSx.
# cluster up (with a Slurm head node) -> sample ImageNet-layout data made and sharded on node0 -> a Slurm job:
# Horovod over mpirun on both nodes -> the run's record fetched back -> cluster down. The cluster comes down whatever happens (trap), and the demo's
# state stays out of ~/.scaletrain. Without root (namespaces and mounts need it) the nodes are sshd processes on
# 127.0.0.1 instead (`launch local up --loopback`), which share this machine's files.
set -euo pipefail
cd "$(dirname "$0")/.."

run="runs/demo-$(date +%Y%m%d-%H%M%S)"
export SCALETRAIN_HOME="$PWD/$run/state"
launch=(.venv/bin/launch)
mkdir -p "$run"

cleanup() { "${launch[@]}" local down >/dev/null 2>&1 && echo "== cluster is down"; }
trap cleanup EXIT

train=(--model resnet18 --image-size 32 --epochs 3 --batch-per-gpu 32 --warmup-epochs 1 --workers 1)
tail=(-- --lr-per-256 0.8 --log-every 5)
if [ "$(id -u)" = 0 ]; then
    echo "== 1/3 cluster: 2 rehearsal nodes and a Slurm head node (the first time, the root is built: minutes,"
    echo "   then cached)"
    "${launch[@]}" local up --slurm --nodes 2
    echo "== 2/3 training: sample data made and sharded on node0 in /fsx, then ResNet-18 at 32 px as a Slurm job the"
    echo "   cluster owns (Ctrl-C only detaches), Horovod over mpirun on both nodes"
    "${launch[@]}" train --cluster local --nodes 2 "${train[@]}" --output /fsx/scaletrain/runs/demo "${tail[@]}"
    "${launch[@]}" jobs --cluster local
    echo "== 3/3 done: the run's record (metrics, summary) in $SCALETRAIN_HOME/runs/local/demo"
else
    echo "== not root: loopback nodes (sshd processes on 127.0.0.1 sharing this machine's files)"
    echo "== 1/3 cluster: 2 nodes, one sshd each on 127.0.0.1"
    "${launch[@]}" local up --loopback --nodes 2
    echo "== 2/3 training: sample data made and sharded, then ResNet-18 at 32 px, Horovod over mpirun on both nodes"
    "${launch[@]}" train --cluster local --nodes 2 "${train[@]}" --output "$run/train" "${tail[@]}"
    echo "== 3/3 done: metrics and checkpoints in $run/train"
fi
