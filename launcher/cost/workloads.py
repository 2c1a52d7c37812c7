"""The workloads `launch plan` and `launch cost` model (``--workload``), and a custom model (``--params``).

Each is a :class:`launcher.cost.inputs.Workload` built from its published recipe: what one epoch is, how many epochs,
the parameters whose gradients are reduced and in what precision, the global batch the recipe holds (gradient
accumulation makes it up when the GPUs' micro-batches fall short), and one node's efficiency when NVIDIA publishes it.
The per-GPU throughput is the catalog's (infra.catalog.published_throughput), per workload per GPU type. Pure.

- ``resnet50``: seed 000's ImageNet recipe (launcher.cost.inputs.imagenet), the default; unchanged.
- ``bert-large``: NVIDIA's BERT-large pre-training with LAMB, phase 1 (sequence length 128, global batch 65,536,
  7,038 steps); phase 2 (sequence length 512, 1,563 steps of 32,768) is not modelled: the time to train is phase 1's,
  about 80% of NVIDIA's pre-training steps. The recipe's gradient accumulation reaches the global batch; gradients are
  reduced in fp16 once per accumulated step (``--allreduce_post_accumulation_fp16``).
  https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/LanguageModeling/BERT/README.md
- ``mask-rcnn``: NVIDIA's Mask R-CNN (ResNet-50-FPN) on COCO 2017: global batch 96, 16,667 iterations = 13.5 epochs
  of 118,287 images, rounded up to 14.
  https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Segmentation/MaskRCNN/README.md
"""

from __future__ import annotations

import math

from infra.catalog import WORKLOADS
from launcher.cost.inputs import Workload, imagenet

__all__ = ["BERT_LARGE_PARAMS", "CHOICES", "MASK_RCNN_PARAMS", "RESNET50_TRAIN_GFLOPS", "custom", "preset"]

CHOICES = WORKLOADS
# Seed 004: "BERT (which has 340 million parameters) ... approximately 650 MB of half-precision data".
BERT_LARGE_PARAMS = 340_000_000
# BERT phase 1: 7,038 optimizer steps of 65,536 sequences (NVIDIA's run_pretraining.sh defaults, README 'Pre-training
# parameters': train_batch_size 65536 = 8,192 per GPU x 8, train_steps 7038 for phase 1).
BERT_PHASE1_STEPS, BERT_PHASE1_BATCH = 7_038, 65_536
# torchvision's maskrcnn_resnet50_fpn: 44,401,393 parameters
# (https://pytorch.org/vision/stable/models/generated/torchvision.models.detection.maskrcnn_resnet50_fpn.html).
MASK_RCNN_PARAMS = 44_401_393
COCO_TRAIN_IMAGES, COCO_VAL_IMAGES = 118_287, 5_000  # COCO 2017 train/val (https://cocodataset.org/#download)
COCO_BYTES = 18_000_000_000 + 778_000_000  # train2017.zip (18 GB) + val2017.zip (778 MB), as cocodataset.org lists
# ResNet-50 at 224 px: 4.1 G multiply-adds forward (torchvision's 'GFLOPS 4.09', which counts multiply-adds) = 8.2
# GFLOP; a training step is about 3x the forward (backward ~2x): ~24.6 GFLOP per image. --sample-gflops divides by it.
RESNET50_TRAIN_GFLOPS = 3 * 2 * 4.09


def preset(name: str, *, epochs: int | None = None, fp16_allreduce: bool = False) -> Workload:
    """The named workload's recipe; ``epochs`` None keeps the recipe's. ``ValueError`` names the choices."""
    if name == "resnet50":
        return imagenet(90 if epochs is None else epochs, fp16_allreduce=fp16_allreduce)
    if name == "bert-large":
        return Workload(
            name="bert-large", sample_noun="sequences",
            images_per_epoch=BERT_PHASE1_STEPS * BERT_PHASE1_BATCH, epochs=1 if epochs is None else epochs,
            param_count=BERT_LARGE_PARAMS, grad_bytes_per_param=2, global_batch=BERT_PHASE1_BATCH,
            # NVIDIA's DGX-1 32G phase-1 table: 8 GPUs 1,746 against 1 GPU 224 = 7.79x (FITTED to it; held out: DGX A100
            # 7.91x and the pytorch:19.07 tables, docs/model-validation.md). No image decoding, no batch norm, and
            # the allreduce once per accumulated step: a node loses far less than ResNet-50's 13%.
            node_efficiency_8gpu=round(1746 / (8 * 224), 3),
            decodes_images=False, val_images=0, checkpoint_bytes_per_param=12, checkpoint_every_epoch=True,
            # ASSUMPTION: NVIDIA's pre-tokenized Wikipedia phase-1 shards, on the order of 20 GB; not a published
            # figure, and staging is a small share of the days phase 1 takes.
            dataset_bytes=20_000_000_000,
        )
    if name == "mask-rcnn":
        return Workload(
            name="mask-rcnn", sample_noun="images", images_per_epoch=COCO_TRAIN_IMAGES,
            epochs=14 if epochs is None else epochs, param_count=MASK_RCNN_PARAMS,
            grad_bytes_per_param=2 if fp16_allreduce else 4, global_batch=96,
            # NVIDIA publishes 8.44x on 8 V100 (8.71x on A100) against one GPU: more than linear (its hybrid loader
            # feeds one GPU worse), so a node is taken at 8 x one GPU.
            node_efficiency_8gpu=1.0, decodes_images=False, val_images=COCO_VAL_IMAGES, dataset_bytes=COCO_BYTES,
        )
    raise ValueError(f"unknown workload '{name}'; choose one of: {', '.join(CHOICES)}")


def custom(*, params: int, sample_gflops: float, samples_per_epoch: int, epochs: int,
           fp16_allreduce: bool = False, global_batch: int | None = None) -> Workload:
    """A model of ``params`` parameters costing ``sample_gflops`` training GFLOP per sample (forward + backward).

    Its per-GPU rate is the catalog's ResNet-50 figure x ResNet-50's GFLOP per image / ``sample_gflops``: the same
    achieved FLOP rate, a first guess until `--gpu-throughput` gives a measured one. ``ValueError`` on bad input.
    """
    if params < 1:
        raise ValueError(f"--params must be at least 1, got {params}")
    if not (sample_gflops > 0 and math.isfinite(sample_gflops)):
        raise ValueError(f"--sample-gflops must be a positive number of GFLOP per sample, got {sample_gflops}")
    if samples_per_epoch < 1:
        raise ValueError(f"--samples-per-epoch must be at least 1, got {samples_per_epoch}")
    return Workload(name="custom", sample_noun="samples", images_per_epoch=samples_per_epoch, epochs=epochs,
                    flops_ratio=sample_gflops / RESNET50_TRAIN_GFLOPS, param_count=params,
                    grad_bytes_per_param=2 if fp16_allreduce else 4, global_batch=global_batch,
                    decodes_images=False, val_images=0, dataset_bytes=0)
