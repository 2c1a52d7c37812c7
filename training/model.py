"""ResNet v1.5 (torchvision's layout; stride 2 in the 3x3 convolution of the bottleneck, as seed 000 uses).

torchvision does not load against the CPU torch build here, so the model is ours. Same block structure,
parameter names and parameter counts as torchvision's resnet18/34/50/101 (ResNet-50: 25,557,032).
"""

from __future__ import annotations

from torch import Tensor, nn

# name -> (block kind, blocks per stage)
ARCHITECTURES: dict[str, tuple[str, tuple[int, int, int, int]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
}


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """v1.5: the stride sits on the 3x3 convolution, not on the first 1x1."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: tuple[int, int, int, int],
                 num_classes: int = 1000, zero_init_residual: bool = True):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, layers[0], stride=1)
        self.layer2 = self._stage(block, 128, layers[1], stride=2)
        self.layer3 = self._stage(block, 256, layers[2], stride=2)
        self.layer4 = self._stage(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            # Seed 000 / Goyal et al.: each residual branch starts as identity, which helps at large batch.
            for m in self.modules():
                if isinstance(m, BasicBlock | Bottleneck):
                    nn.init.zeros_(m.last_bn().weight)

    def _stage(self, block: type[BasicBlock | Bottleneck], width: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != width * block.expansion:
            downsample = nn.Sequential(_conv1x1(self.inplanes, width * block.expansion, stride),
                                       nn.BatchNorm2d(width * block.expansion))
        layers = [block(self.inplanes, width, stride, downsample)]
        self.inplanes = width * block.expansion
        layers += [block(self.inplanes, width, 1, None) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def check_model(name: str) -> None:
    """ValueError with the choices when `name` is not one of ours."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model '{name}'; choose one of: {', '.join(ARCHITECTURES)}")


def build_model(name: str, num_classes: int, zero_init_residual: bool = True) -> ResNet:
    check_model(name)
    kind, layers = ARCHITECTURES[name]
    block = BasicBlock if kind == "basic" else Bottleneck
    return ResNet(block, layers, num_classes=num_classes, zero_init_residual=zero_init_residual)


def flops_per_image(name: str, image_size: int, num_classes: int = 1000) -> float:
    """Multiply-accumulates of one forward pass (convolutions and the classifier), counted analytically.

    Used by the cost model to scale the catalog's ResNet-50-at-224 throughput to another model and size.
    """
    check_model(name)
    kind, layers = ARCHITECTURES[name]
    expansion = 1 if kind == "basic" else 4

    def out(size: int, stride: int, k: int) -> int:
        return (size + 2 * (k // 2) - k) // stride + 1

    s = out(image_size, 2, 7)
    macs = s * s * 3 * 64 * 49
    s = out(s, 2, 3)  # max pool
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
        for b in range(blocks):
            stride = 2 if (stage > 0 and b == 0) else 1
            so = out(s, stride, 3)
            if kind == "basic":
                macs += so * so * (cin * width * 9 + width * width * 9)
            else:
                macs += s * s * cin * width + so * so * width * width * 9 + so * so * width * width * 4
            if b == 0 and (stride != 1 or cin != width * expansion):
                macs += so * so * cin * width * expansion
            cin, s = width * expansion, so
    return float(macs + cin * num_classes)


def parameter_count(name: str, num_classes: int = 1000) -> int:
    """Trainable parameters: the gradient a step must allreduce."""
    return sum(p.numel() for p in build_model(name, num_classes).parameters())
