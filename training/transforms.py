"""Image transforms, ours because torchvision does not load here. Geometry is pure and seeded.

Training: RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3, torchvision's algorithm) + horizontal flip. The crop
box is drawn from the JPEG header alone; the image is then decoded at the smallest DCT scale (1, 1/2, 1/4, 1/8)
at which the crop still has at least `size` pixels each way (libjpeg-turbo through simplejpeg, fast DCT), so a
large original or a small output decodes a fraction of the pixels; only the crop is resized (bilinear,
antialiased, on uint8 with torch's vectorised kernel), straight to size x size. bench/loader.py records what
each of these steps buys.
Validation: torchvision's Resize(round(size * 256 / 224)) + CenterCrop(size), pixel for pixel: full decode,
PIL bilinear resize of the whole image, then the centered crop (256 -> 224 at full size).

Both hand back uint8 HWC tensors. Batches are stacked as NHWC memory and handed out as NCHW views of it
(channels_last strides), so the CPU never transposes or converts to float; `normalize` does that on the device,
on whole batches.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
DCT_SCALES = (8, 4, 2)  # libjpeg's fast power-of-two reductions; 3/4, 5/8 etc. decode slower than full size


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


def val_resize_short(size: int) -> int:
    """The shorter side validation resizes to: 256 for a 224 crop, in proportion for other sizes."""
    return round(size * 256 / 224)


def center_crop_box(width: int, height: int, size: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """torchvision's Resize(short) target (w, h) and CenterCrop(size) box in it, short = val_resize_short(size).

    Resize keeps the aspect ratio with the longer side truncated (int(short * long / shorter)); the crop is
    offset by int(round((side - size) / 2)).
    """
    short = val_resize_short(size)
    if width <= height:
        rw, rh = short, int(short * height / width)
    else:
        rw, rh = int(short * width / height), short
    left, top = int(round((rw - size) / 2.0)), int(round((rh - size) / 2.0))
    return (rw, rh), (left, top, left + size, top + size)


def dct_scale(crop_width: int, crop_height: int, size: int) -> int:
    """The largest DCT reduction (8, 4, 2 or 1) that leaves the crop at least `size` px each way."""
    for scale in DCT_SCALES:
        if crop_width >= size * scale and crop_height >= size * scale:
            return scale
    return 1


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header; Pillow's parser for anything libjpeg-turbo's does not take."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        return width, height
    except ValueError:
        with Image.open(io.BytesIO(data)) as im:
            return im.size


def decode_reduced(data: bytes, width: int, height: int, scale: int, fast: bool = False) -> np.ndarray:
    """RGB HWC uint8 at 1/scale of (width, height), rounded up; libjpeg-turbo, else Pillow (PNG, CMYK).

    `fast`: libjpeg-turbo's fast integer DCT and plain chroma upsampling, about 10% faster and invisible after
    a random crop and resize (FFCV decodes training images the same way).
    """
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast,
                                      min_width=-(-width // scale), min_height=-(-height // scale))
    except ValueError:
        with Image.open(io.BytesIO(data)) as im:
            if scale > 1:
                im.draft("RGB", (width // scale, height // scale))  # Pillow picks the scale by floor division
            return np.array(im.convert("RGB"))


def train_geometry(data: bytes, rng: random.Random) -> tuple[int, int, tuple[int, int, int, int], bool]:
    """(width, height, crop box, flip) of one encoded image's RandomResizedCrop + flip, from its header alone.

    The CPU path (train_transform) and the GPU path (training.gpudecode, which decodes elsewhere) both draw through
    here, in the same order, so one seed gives both the same crops and flips."""
    width, height = jpeg_size(data)
    box = random_resized_crop_box(width, height, rng)
    return width, height, box, rng.random() < 0.5


def train_transform(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    """RandomResizedCrop + flip of one encoded image: a size x size x 3 uint8 tensor."""
    width, height, (left, top, w, h), flip = train_geometry(data, rng)
    pixels = decode_reduced(data, width, height, dct_scale(w, h, size), fast=True)
    # The crop box in the decoded image's coordinates (libjpeg rounds reduced sides up).
    fx, fy = pixels.shape[1] / width, pixels.shape[0] / height
    x0, y0 = min(round(left * fx), pixels.shape[1] - 1), min(round(top * fy), pixels.shape[0] - 1)
    x1, y1 = max(x0 + 1, round((left + w) * fx)), max(y0 + 1, round((top + h) * fy))
    crop = torch.from_numpy(pixels[y0:y1, x0:x1]).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    out = out[0].permute(1, 2, 0)
    if flip:
        out = out.flip(1)
    return out.contiguous()


def val_transform(data: bytes, size: int) -> torch.Tensor:
    """Resize the shorter side to val_resize_short(size), center-crop size x size: a uint8 HWC tensor."""
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    resized, box = center_crop_box(rgb.width, rgb.height, size)
    return torch.from_numpy(np.array(rgb.resize(resized, Image.Resampling.BILINEAR).crop(box)))


def collate(images: list[torch.Tensor]) -> torch.Tensor:
    """HWC samples -> one NCHW uint8 batch, a view of NHWC memory (channels_last): no transpose on the CPU."""
    return torch.stack(images).permute(0, 3, 1, 2)


def normalize(batch: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    """uint8 NCHW images (any strides), on the device -> normalized float NCHW in `memory_format`."""
    if batch.dim() != 4 or batch.shape[1] != 3:
        raise ValueError(f"normalize takes uint8 NCHW images with 3 channels, got shape {tuple(batch.shape)}")
    x = batch.contiguous(memory_format=memory_format).float()
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)
