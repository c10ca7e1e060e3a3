"""A U-Net in plain torch: the segmentation model that ``benchmarks/models.py`` times.

``UNet()`` is Ronneberger et al.'s shape with padded convolutions and batch norm: an encoder of five
levels (64, 128, 256, 512 and 1024 channels), each two 3x3 convolution + batch norm + ReLU blocks, a
2x2 max pool between levels; a decoder that upsamples by 2 (``nn.Upsample``, bilinear), halves the
channels with a 3x3 convolution block, concatenates the encoder's features of that level and runs two
blocks; a 1x1 convolution to the classes. Input sides must be multiples of 16. Its logits come with the
classes last, (N, H, W, classes), as ``models.py``'s cross-entropy takes them (a view of the NCHW logits).
"""

from __future__ import annotations

import torch
from torch import nn

WIDTHS = (64, 128, 256, 512, 1024)
CLASSES = 21  # PASCAL VOC's, background included


def _block(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU())


class Up(nn.Module):
    """Upsample by 2, a block to half the channels, the skip concatenated, two blocks."""

    def __init__(self, inputs: int) -> None:
        super().__init__()
        outputs = inputs // 2
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear")
        self.reduce = _block(inputs, outputs)
        self.merge = nn.Sequential(_block(2 * outputs, outputs), _block(outputs, outputs))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.merge(torch.cat([self.reduce(self.upsample(x)), skip], dim=1))


class UNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = WIDTHS, classes: int = CLASSES) -> None:
        super().__init__()
        self.encoder = nn.ModuleList(
            nn.Sequential(_block(inputs, outputs), _block(outputs, outputs))
            for inputs, outputs in zip((3, *widths[:-1]), widths)
        )
        self.pool = nn.MaxPool2d(2)
        self.decoder = nn.ModuleList(Up(width) for width in reversed(widths[1:]))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for k, level in enumerate(self.encoder):
            x = level(x if k == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for up in self.decoder:
            x = up(x, skips.pop())
        return self.head(x).movedim(1, -1)
