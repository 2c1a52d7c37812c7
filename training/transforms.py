"""Image transforms, ours because torchvision does not load here. Geometry is pure and seeded.

Training: RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3, torchvision's algorithm) + horizontal flip.
Validation: resize the shorter side to size*256/224, then center-crop `size` (256 -> 224 at full size).
Both hand back uint8 HWC arrays; normalization happens on the device, on whole batches.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def random_resized_crop_box(width: int, height: int, rng: random.Random, scale=(0.08, 1.0),
                            ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(left, top, crop_width, crop_height), as torchvision's RandomResizedCrop.get_params."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    # Fallback: the largest center crop within the ratio range.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, size: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """Resize target (w, h) for a shorter side of size*256/224, and the centered size x size box in it."""
    short = round(size * 256 / 224)
    if width <= height:
        rw, rh = short, max(short, round(height * short / width))
    else:
        rw, rh = max(short, round(width * short / height)), short
    left, top = (rw - size) // 2, (rh - size) // 2
    return (rw, rh), (left, top, left + size, top + size)


def decode_rgb(jpeg: bytes, min_side: int | None = None) -> Image.Image:
    """Decode to RGB; with min_side, let libjpeg decode at a reduced DCT scale that keeps that side."""
    im = Image.open(io.BytesIO(jpeg))
    if min_side is not None:
        im.draft("RGB", (min_side, min_side))
    return im.convert("RGB")


def train_transform(jpeg: bytes, size: int, rng: random.Random) -> np.ndarray:
    im = decode_rgb(jpeg)
    left, top, w, h = random_resized_crop_box(im.width, im.height, rng)
    im = im.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(im, dtype=np.uint8)


def val_transform(jpeg: bytes, size: int) -> np.ndarray:
    im = decode_rgb(jpeg, min_side=round(size * 256 / 224))
    (rw, rh), box = center_crop_box(im.width, im.height, size)
    return np.asarray(im.resize((rw, rh), Image.BILINEAR).crop(box), dtype=np.uint8)


def normalize(batch: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    """uint8 NHWC on the device -> normalized float NCHW."""
    x = batch.permute(0, 3, 1, 2).float()
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous(memory_format=memory_format)
