"""Training images decoded on the rank's GPU: nvJPEG through torchvision, then the crop, resize and flip there too.

`--decode gpu` moves the loader's costliest step, JPEG decoding, off the CPUs. The loader's workers still read
the shards, shuffle, and draw each sample's RandomResizedCrop box and flip from its JPEG header alone
(training.transforms.train_geometry: the same seeded draws as the CPU path, so one seed gives both paths the same
crops); they hand over encoded batches (training.loader.EncodedBatch). Here, in the rank's process:

  decode   one call per batch, `torchvision.io.decode_jpeg(list_of_jpegs, mode=RGB, device="cuda")`: nvJPEG, and
           on A100 and H100 its batched hardware decoder for baseline JPEGs (progressive ones fall back to its
           CUDA decoder) ("decode_jpeg ... input (Tensor or list[Tensor]) ... device: if a cuda device is
           specified, the image will be decoded with nvjpeg",
           https://docs.pytorch.org/vision/stable/generated/torchvision.io.decode_jpeg.html; the hardware JPEG
           decoder: https://developer.nvidia.com/blog/leveraging-the-hardware-jpeg-decoder-and-nvjpeg-on-a100/,
           and the H100's seven NVJPG engines, NVIDIA H100 Tensor Core GPU Architecture whitepaper, p. 12)
  crop     each image's box as a view of the decoded image, resized to size x size in float (bilinear,
           antialiased: the CPU path's interpolation), then the batch's flips in one operation and one rounding
           back to uint8 NCHW, channels_last: the CPU loader's batch, already on the device

A sample nvJPEG refuses (CMYK, a PNG named .JPEG: ImageNet has both) is decoded on the CPU instead and copied up,
so a batch never fails for one odd file; one that neither decodes is a DataError naming its shard and key.

A thread of the rank's process does this one or two batches ahead, on a CUDA stream of its own, so decoding
overlaps the step before; the training loop's stream waits on an event before it reads the batch.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from training.loader import EncodedBatch, Loader, undecodable
from training.transforms import decode_reduced, jpeg_size

Decoder = Callable[[list[torch.Tensor]], list[torch.Tensor]]  # encoded JPEGs -> uint8 CHW images, on the device


class GpuDecodeError(RuntimeError):
    """--decode gpu cannot run here; one line for the user."""


def nvjpeg(device: torch.device) -> Decoder:
    """torchvision's batched nvJPEG decode onto `device`; a GpuDecodeError when this machine cannot."""
    if device.type != "cuda":
        raise GpuDecodeError("--decode gpu needs a CUDA GPU; this rank has none (use --decode cpu)")
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as e:
        raise GpuDecodeError(f"--decode gpu needs torchvision (nvJPEG): {e}; install it or use --decode cpu") from None

    def decode(jpegs: list[torch.Tensor]) -> list[torch.Tensor]:
        return decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)

    return decode


def cpu_decode(jpeg: torch.Tensor, key: str, device: torch.device) -> torch.Tensor:
    """One sample nvJPEG refused, decoded by the CPU path's decoder (libjpeg-turbo, else Pillow), as CHW."""
    data = jpeg.numpy().tobytes()
    try:
        width, height = jpeg_size(data)
        pixels = decode_reduced(data, width, height, 1)
    except Exception as exc:
        shard, _, name = key.partition(":")
        raise undecodable(shard, name, exc) from None
    return torch.from_numpy(pixels).permute(2, 0, 1).to(device)


def decode_batch(batch: EncodedBatch, decode: Decoder, device: torch.device) -> list[torch.Tensor]:
    """The batch's images, decoded in one call; if that call refuses one, each alone, the refused on the CPU."""
    jpegs = batch.jpegs()
    try:
        return decode(jpegs)
    except RuntimeError:
        out = []
        for key, jpeg in zip(batch.keys, jpegs, strict=True):
            try:
                out.append(decode([jpeg])[0])
            except RuntimeError:
                out.append(cpu_decode(jpeg, key, device))
        return out


def crop_resize_flip(images: list[torch.Tensor], geometry: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 CHW images (any sizes) and their (left, top, width, height, flip) rows -> uint8 NCHW size x size,
    channels_last, on the images' device: RandomResizedCrop's resize (bilinear, antialiased) and flip."""
    device = images[0].device
    out = torch.empty((len(images), 3, size, size), dtype=torch.float32, device=device)
    for i, (image, (left, top, w, h, _)) in enumerate(zip(images, geometry.tolist(), strict=True)):
        height, width = image.shape[-2:]
        left, top = min(max(left, 0), width - 1), min(max(top, 0), height - 1)  # a header that lied: stay inside
        crop = image[None, :3, top:top + max(1, h), left:left + max(1, w)].float()
        out[i] = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    flips = geometry[:, 4].to(device=device, dtype=torch.bool).view(-1, 1, 1, 1)
    out = torch.where(flips, out.flip(3), out)
    return out.round_().clamp_(0, 255).to(torch.uint8).contiguous(memory_format=torch.channels_last)


class GpuBatches(Iterator):
    """(images uint8 NCHW, labels int64), both on `device`, from a loader of (EncodedBatch, labels) batches.

    A daemon thread decodes up to `ahead` batches in advance, on its own CUDA stream; a loader error reaches the
    caller as the same exception, at the batch it belongs to. close() (or dropping the iterator) stops the thread
    and with it the loader's workers."""

    def __init__(self, loader: Iterable, size: int, device: torch.device, decode: Decoder | None = None,
                 ahead: int = 2):
        self.size, self.device = size, device
        self.decode = decode or nvjpeg(device)
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.ready: queue.Queue = queue.Queue(maxsize=ahead)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(iter(loader),), name="gpudecode", daemon=True)
        self.thread.start()

    def _run(self, batches: Iterator) -> None:
        try:
            for encoded, labels in batches:
                with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                    images = crop_resize_flip(decode_batch(encoded, self.decode, self.device), encoded.geometry,
                                              self.size)
                    labels = labels.to(self.device, non_blocking=True)
                    event = torch.cuda.Event() if self.cuda else None
                    if event is not None:
                        event.record(self.stream)
                if not self._put((images, labels, event)):
                    return
            self._put(StopIteration())
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            self._put(e)

    def _put(self, item) -> bool:
        while not self.stopping.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.ready.get()
        if isinstance(item, BaseException):
            self.ready.put(item)  # every later call ends the same way
            raise item
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            images.record_stream(current)  # made on our stream, used and freed on this one
            labels.record_stream(current)
        return images, labels

    def close(self) -> None:
        self.stopping.set()
        while True:
            try:
                self.ready.get_nowait()
            except queue.Empty:
                break
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=30)

    def __del__(self):
        if hasattr(self, "thread"):
            self.close()


def synthetic_batches(batch: int, size: int, classes: int, device: torch.device, seed: int, rank: int):
    """One fixed random uint8 batch (NCHW, as the loader hands them) on the device, forever: no I/O at all."""
    g = torch.Generator().manual_seed(seed * 100_003 + rank)
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g).to(device)
    labels = torch.randint(0, classes, (batch,), generator=g).to(device)
    while True:
        yield images, labels


def batches(loader: Loader, size: int, device: torch.device) -> Iterator:
    """The training loop's batches: the loader's own, or, where make_loader(decode="gpu") gave it an encoded stream,
    decoded here on the GPU."""
    return GpuBatches(loader, size, device) if loader.stream.encoded else iter(loader)
