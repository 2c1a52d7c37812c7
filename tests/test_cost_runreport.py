"""The report after `launch train`: measured against predicted for the shape that ran, and the AWS comparison."""

from __future__ import annotations

import json

import pytest

from infra.catalog import get
from launcher import cluster as clusters
from launcher.cli import trainreport
from launcher.cluster import Cluster, Node
from launcher.cost import measured
from launcher.cost.inputs import imagenet
from launcher.cost.model import estimate, node_efficiency
from launcher.execute import run
from launcher.plans import job as plan


def aws_cluster(nodes: int) -> Cluster:
    workers = [Node(name=f"node{i}", address=f"10.0.0.{10 + i}", role="worker", slots=8, cpus=64, gpus=8,
                    workdir="/home/ubuntu/scaletrain") for i in range(nodes)]
    return Cluster(name="p3-test", backend="aws", nodes=workers, user="ubuntu", ssh_config="/s/ssh_config",
                   known_hosts="/s/known_hosts", python="/opt/scaletrain/.venv/bin/python",
                   instance_type="p3.16xlarge")


def gpu_summary(ranks: int, images_per_sec: float, epochs: int = 2) -> dict:
    steps, global_batch = 1_281_167 // ranks // 256, ranks * 256
    images = epochs * steps * global_batch
    return {"model": "resnet50", "classes": 1000, "ranks": ranks, "epochs": epochs, "steps_per_epoch": steps,
            "global_batch": global_batch, "top1": 0.05, "top5": 0.15, "val_samples": 50_000,
            "train_images": images, "images_per_sec": images_per_sec, "steady_images_per_sec": images_per_sec * 1.02,
            "time_s": images / images_per_sec, "precision": "fp16", "device": "Tesla V100-SXM2-16GB"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def report(cluster: Cluster, summary: dict, capsys, *, pass_cluster: bool) -> str:
    spec = plan.TrainSpec(data="/shared/imagenet", output="/shared/runs/r1", epochs=summary["epochs"])
    result = run.RunResult(exit_code=0, output=spec.output, train_images=1_281_167, summary=summary)
    trainreport.report(cluster.workers, spec, result, cluster if pass_cluster else None)
    return capsys.readouterr().out


def test_aws_run_is_compared_with_the_prediction_for_its_shape(home, capsys):
    c = aws_cluster(8)
    clusters.cluster_dir(c.name).mkdir(parents=True)
    clusters.save(c)  # the report finds the cluster from the nodes it is given, as `launch train` calls it
    predicted = estimate(get("p3.16xlarge"), 8, imagenet(2)).images_per_sec
    out = report(c, gpu_summary(64, 0.9 * predicted), capsys, pass_cluster=False)
    assert "measured vs predicted: 8 x p3.16xlarge, on-demand" in out
    assert "-10.0%" in out and "+11.1%" in out
    assert "measured throughput was 10.0% below the model's prediction for 8 x p3.16xlarge" in out
    assert "the same run on AWS" in out
    assert not measured.path(home).exists()  # 8 nodes: the per-GPU rate is not what was measured


def test_a_one_node_resnet50_run_records_the_measured_per_gpu_figure(home, capsys):
    c = aws_cluster(1)
    out = report(c, gpu_summary(8, 8 * 1000.0, epochs=1), capsys, pass_cluster=True)
    # 1,000 per GPU with 8 in the node is 1,000 / 0.867 for one GPU alone, the figure the model starts from.
    alone = 1000.0 / node_efficiency(8)
    assert f"recorded {alone:,.0f} img/s per GPU as this project's measured V100/amp figure" in out
    figures, note = measured.load(measured.path(home))
    assert note is None and figures["V100/amp"].img_per_sec == pytest.approx(alone)
    assert "1 x p3.16xlarge, 8 rank(s), resnet50 at 224 px, fp16" in figures["V100/amp"].source
    # The model now uses it: the next prediction for V100s is at 1,000 img/s per GPU.
    again = report(c, gpu_summary(8, 8 * 1000.0, epochs=1), capsys, pass_cluster=True)
    assert "measured throughput matched the model's prediction" in again
    assert json.loads(measured.path(home).read_text()).keys() == {"V100/amp"}


def test_a_local_cpu_run_says_the_model_does_not_cover_it_and_still_prices_aws(home, capsys):
    local = Cluster(name="local", backend="local", user="root", ssh_config="/s", known_hosts="/k", python="python",
                    mpi_interface="lo",
                    nodes=[Node(name=f"node{i}", address="127.0.0.1", port=42000 + i, role="worker", slots=1, cpus=1,
                                workdir=f"/w{i}") for i in range(2)])
    summary = {"model": "resnet18", "classes": 4, "ranks": 2, "epochs": 3, "steps_per_epoch": 6, "global_batch": 16,
               "train_images": 288, "images_per_sec": 40.0, "time_s": 7.2, "precision": "fp32", "device": "cpu",
               "top1": 0.5, "top5": 1.0}
    spec = plan.TrainSpec(data="/d", output="/o", model="resnet18", image_size=32, epochs=3, batch_per_gpu=8)
    trainreport.report(local.workers, spec, run.RunResult(0, "/o", 96, summary), local)
    out = capsys.readouterr().out
    assert "measured vs predicted: not available" in out and "ran on CPUs of the local cluster 'local'" in out
    assert "the same run on AWS (2 node(s), 96 images x 3 epochs)" in out
    assert "p4d.24xlarge" in out and "limited by" in out
