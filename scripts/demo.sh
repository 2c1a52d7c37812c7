#!/usr/bin/env bash
# `make demo`: the whole job on a local 2-node cluster of real sshd processes.
# cluster up -> sample ImageNet-layout data -> shards -> Horovod over mpirun -> report -> cluster down.
# The cluster comes down whatever happens (trap), and the demo's state stays out of ~/.scaletrain.
set -euo pipefail
cd "$(dirname "$0")/.."

run="runs/demo-$(date +%Y%m%d-%H%M%S)"
export SCALETRAIN_HOME="$PWD/$run/state"
launch=(.venv/bin/launch)
mkdir -p "$run"

cleanup() { "${launch[@]}" local down >/dev/null 2>&1 && echo "== cluster is down"; }
trap cleanup EXIT

echo "== 1/5 cluster: 2 nodes, one sshd each on 127.0.0.1"
"${launch[@]}" local up --nodes 2

echo "== 2/5 sample data: 10 classes in the ILSVRC2012 layout"
"${launch[@]}" data sample --out "$run/sample-ilsvrc" --classes 10 --per-class 100 --val-per-class 20

echo "== 3/5 shards: WebDataset tars + manifest.json"
"${launch[@]}" data convert "$run/sample-ilsvrc" --out "$run/shards" --shard-size 100

echo "== 4/5 training: ResNet-18 at 32 px, Horovod over mpirun on both nodes"
"${launch[@]}" train --cluster local --nodes 2 --data "$run/shards" --model resnet18 --image-size 32 \
    --epochs 8 --batch-per-gpu 32 --warmup-epochs 1 --workers 1 --output "$run/train" \
    -- --lr-per-256 0.8 --log-every 5

echo "== 5/5 done: metrics and checkpoints in $run/train"
