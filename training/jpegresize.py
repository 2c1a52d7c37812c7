"""The converter's fast shrink of a JPEG: reduced-DCT decode, one antialiased resize, re-encode; libjpeg-turbo and
torch's vectorised uint8 kernel, when both are installed (the trainer's image has them).

Three costs make a resize, and each has a faster form than Pillow's (bench/convert.py, 500x375 q90 to a 256 px
shorter side on one core: Pillow's decode + bicubic resize + encode ran at 0.29x decode-only):

- decode: libjpeg-turbo through simplejpeg, at the largest power-of-two DCT reduction (1/2, 1/4, 1/8) that still
  leaves at least the target size, with its fast integer IDCT and plain chroma upsampling. The 4:2:0 chroma is
  subsampled again on encode, so the finer upsampling would be thrown away. libjpeg-turbo's other scaling factors
  (eighths: 7/8, 3/4, 5/8, 3/8) are left out: it has no SIMD for them and they decode slower than full size
  (:func:`decode` has the figures).
- resize: bilinear with antialiasing (Pillow's and torchvision's sense: the filter widens with the reduction, so a
  shrink averages every source pixel), on uint8 HWC with torch's AVX2 kernel, written straight into the HWC
  buffer the encoder reads (no NCHW round trip).
- encode: libjpeg-turbo at the requested quality, 4:2:0 as Pillow's default.

:func:`shrink` returns None when it cannot do the job (no simplejpeg or torch, a CMYK or otherwise unusual JPEG,
any decoder error): the caller then takes Pillow's path, which also names what is wrong with a corrupt file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import numpy as np

__all__ = ["available", "decode", "encode", "encoder", "jpeg_size", "one_thread", "power_of_two_reduction", "resize",
           "shrink"]

DCT_REDUCTIONS = (8, 4, 2)


@cache
def _modules():
    try:
        import simplejpeg
        import torch
    except ImportError:
        return None
    return simplejpeg, torch


def available() -> bool:
    return _modules() is not None


def encoder() -> str | None:
    """What decides the bytes of a shrunk image (part of every shard's fingerprint), or None without the fast path."""
    mods = _modules()
    if mods is None:
        return None
    simplejpeg, torch = mods
    return f"simplejpeg {simplejpeg.__version__} + torch {torch.__version__.split('+')[0]} bilinear-aa rows first"



@contextmanager
def one_thread() -> Iterator[None]:
    """torch's kernels on the calling thread only, for as long as the block runs (then as before).

    The converter is parallel by processes, one per core; torch would also start a thread per physical core in
    each of them for every resize. On this 2-core machine, with another job on the other core, that made the
    converting thread wait on its descheduled partner at every resize: 3.8-6.0 ms of CPU per image instead of
    3.15 (bench/convert.py's images); on a 96-vCPU node, 96 workers x 48 threads each.
    """
    mods = _modules()
    if mods is None:
        yield
        return
    torch = mods[1]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def power_of_two_reduction(width: int, height: int, target: tuple[int, int]) -> int:
    """The largest of 8, 4, 2 (else 1) by which a DCT-scaled decode still covers ``target`` each way."""
    for scale in DCT_REDUCTIONS:
        if width // scale >= target[0] and height // scale >= target[1]:
            return scale
    return 1


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG the fast path can decode to RGB (YCbCr, RGB or grayscale), from its header alone;
    None for anything else (not a JPEG, CMYK, no fast path)."""
    mods = _modules()
    if mods is None or data[:2] != b"\xff\xd8":
        return None
    try:
        height, width, colorspace, _ = mods[0].decode_jpeg_header(data)
    except ValueError:
        return None
    return (width, height) if colorspace in ("YCbCr", "RGB", "Gray") else None


def decode(data: bytes, width: int, height: int, target: tuple[int, int]) -> np.ndarray | None:
    """RGB HWC uint8 at the power-of-two reduction of ``width`` x ``height`` that still covers ``target``, or None.

    simplejpeg's min_width/min_height pick the smallest of all libjpeg-turbo's scaling factors, eighths included
    (for 500x375 to 256: 3/4), so they are given the power-of-two size, not the target: on the 500x375 q90
    images of bench/convert.py the 3/4 decode took 2.4 ms against 1.7 ms at full size (its 6x6 IDCT is plain C),
    more than the smaller resize after it saves (0.45 against 0.6 ms).
    """
    simplejpeg = _modules()[0]
    scale = power_of_two_reduction(width, height, target)
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True,
                                      min_width=-(-width // scale), min_height=-(-height // scale))
    except ValueError:  # truncated, corrupt or CMYK: Pillow's path rejects or converts it
        return None


def resize(pixels: np.ndarray, target: tuple[int, int]) -> np.ndarray:
    """``pixels`` (RGB HWC uint8) at exactly ``target`` (w, h): antialiased bilinear, rows first.

    Separable, so the two passes can go in either order; torch does the horizontal one first when asked for both,
    and its uint8 horizontal pass costs about 2.4x its vertical one per output pixel (bench/convert.py's
    images: 0.57 ms for 500x375 -> 341x375, 0.24 ms for 500x375 -> 500x256). Shrinking the rows first runs the
    costly pass on the fewer rows: 12-14% less time, the same picture to within one level of rounding.
    """
    h, w = pixels.shape[:2]
    tw, th = target
    if th != h and tw != w:  # both passes: the vertical one on all columns, then the horizontal on th rows
        pixels = _bilinear_aa(pixels, th, w)
    return _bilinear_aa(pixels, th, tw)


def _bilinear_aa(pixels: np.ndarray, th: int, tw: int) -> np.ndarray:
    torch = _modules()[1]
    out = np.empty((th, tw, 3), np.uint8)
    source = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)  # an NCHW view of HWC: channels_last
    # Antialiased bilinear, the uint8 AVX2 kernel (PyTorch >= 2.1), into the HWC buffer the encoder reads.
    torch._C._nn._upsample_bilinear2d_aa(source, [th, tw], False, out=torch.from_numpy(out).permute(2, 0, 1)[None])
    return out


def encode(pixels: np.ndarray, quality: int) -> bytes:
    return _modules()[0].encode_jpeg(pixels, quality=quality, colorspace="RGB", colorsubsampling="420")


def shrink(data: bytes, width: int, height: int, target: tuple[int, int], quality: int) -> bytes | None:
    """``data`` (an RGB or grayscale JPEG of ``width`` x ``height``) as a JPEG of exactly ``target``, or None."""
    if _modules() is None:
        return None
    pixels = decode(data, width, height, target)
    return None if pixels is None else encode(resize(pixels, target), quality)
