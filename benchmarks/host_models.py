"""Whole models on the host path: what each step of a converted model costs, and what its calls did.

``benchmarks/host_overhead.py --model NAME`` runs a whole converted model (``mobilenet_v2``,
``resnet50``: torchvision's architectures, built here from torch.nn, so torchvision is not needed) on a
small channels-last input with Triton's kernels stubbed, stepped as ``benchmarks/models.py`` steps it
on a GPU: under bf16 autocast (its cache off) inside ``functional_calls()``; inference (eval,
``no_grad``) and training (an SGD step on a cross-entropy loss), each converted and through
``opendnn.torch.fuse``. Per step it prints the host time (thread CPU time; on the CPU it includes
torch's own arithmetic on real tensors: the autocast casts of the weights, the residual additions,
the optimizer) and what the step's opendnn calls did: how many replayed an executable, how many
problems ran the full path (through ``dispatch``), how many calls were recorded, the calls of
signatures kept as a ``Fallback`` (with the reasons), and the calls made inside the step that wait
for the device on a GPU (``Tensor.item``, ``.cpu()``, ``.numpy()``, ``.tolist()``, ``.nonzero()``, a
tensor's truth value or number, ``torch.cuda.synchronize``).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import models
import torch
import torch.nn.functional as TF
from torch import nn

import opendnn.torch as ot
from opendnn.core import dispatch
from opendnn.torch import library
from opendnn.torch.executables import Executable, Fallback

CLASSES = 10
MODES = ("inference", "training", "inference (fused)", "training (fused)")


# ---- the models: torchvision's MobileNetV2 and ResNet-50, from torch.nn -------------------------------


def _conv_bn_relu6(inputs: int, outputs: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion -> 3x3 depthwise -> 1x1 projection (+ x where the shapes allow)."""

    def __init__(self, inputs: int, outputs: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = inputs * expansion
        self.use_residual = stride == 1 and inputs == outputs
        layers = [_conv_bn_relu6(inputs, hidden, kernel=1)] if expansion != 1 else []
        layers += [
            _conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, outputs, 1, bias=False),
            nn.BatchNorm2d(outputs),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, blocks, first stride): torchvision's table
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, stride=2)]
        channels = 32
        for expansion, outputs, blocks, stride in self.SETTINGS:
            for k in range(blocks):
                layers.append(InvertedResidual(channels, outputs, stride if k == 0 else 1, expansion))
                channels = outputs
        layers.append(_conv_bn_relu6(channels, 1280, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = TF.adaptive_avg_pool2d(self.features(x), (1, 1))  # (torchvision's forward calls it)
        return self.classifier(torch.flatten(x, 1))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 -> 3x3 (stride) -> 1x1 x4, each with batch norm, += the shortcut, relu."""

    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        outputs = width * 4
        self.conv1, self.bn1 = nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu, self.maxpool = nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        layers, channels = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            blocks_of_stage = [Bottleneck(channels, width, stride)]
            blocks_of_stage += [Bottleneck(width * 4, width, 1) for _ in range(blocks - 1)]
            layers.append(nn.Sequential(*blocks_of_stage))
            channels = width * 4
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(2048, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


BUILDERS: dict[str, Callable[[], nn.Module]] = {"mobilenet_v2": MobileNetV2, "resnet50": ResNet50}


# ---- what a step does ---------------------------------------------------------------------------------

# calls that wait for the device's queue to drain (on a GPU), as torch.Tensor methods, by name
WAITING_METHODS = ("item", "cpu", "numpy", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero")


class Counts:
    """What the opendnn calls of a stretch of code did (``with counts.counting():``)."""

    active: Counts | None = None  # the Counts whose stretch of code runs (executables' replays count there)

    def __init__(self) -> None:
        self.full = 0  # problems through dispatch: the full path
        self.replays = 0  # calls that replayed an executable
        self.recordings = 0
        self.fallbacks: Counter[str] = Counter()  # calls of a Fallback, by its reason
        self.waits: Counter[str] = Counter()  # calls that wait for the device, by name

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        saved = [(dispatch, "_run"), (library, "record"), (Fallback, "replay"), (Executable, "__init__")]
        saved += [(torch.cuda, "synchronize")] + [(torch.Tensor, name) for name in WAITING_METHODS]
        originals = [(owner, name, getattr(owner, name)) for owner, name in saved]
        run, record, fallback, made, synchronize = (original for _, _, original in originals[:5])
        Counts.active = self

        def counted_run(*args: Any) -> Any:
            self.full += 1
            return run(*args)

        def counted_record(*args: Any) -> Any:
            self.recordings += 1
            return record(*args)

        def counted_fallback(kept: Fallback, args: tuple[Any, ...]) -> Any:
            self.fallbacks[kept.reason] += 1
            return fallback(kept, args)

        def counted_executable(executable: Executable, *args: Any) -> None:  # its replays count in the active Counts
            made(executable, *args)
            replay = executable.replay

            def counted_replay(args: tuple[Any, ...]) -> Any:
                if Counts.active is not None:
                    Counts.active.replays += 1
                return replay(args)

            executable.replay = counted_replay

        def waiting(name: str, method: Any) -> Any:
            def wait(*args: Any, **kwargs: Any) -> Any:
                self.waits[name] += 1
                return method(*args, **kwargs)

            return wait

        dispatch._run = counted_run
        library.record = counted_record
        Fallback.replay = counted_fallback
        Executable.__init__ = counted_executable
        torch.cuda.synchronize = waiting("torch.cuda.synchronize", synchronize)
        for owner, name, original in originals[5:]:
            setattr(owner, name, waiting(f"Tensor.{name}", original))
        try:
            yield
        finally:
            Counts.active = None
            for owner, name, original in originals:
                setattr(owner, name, original)


def model_step(name: str, mode: str, x: torch.Tensor) -> Callable[[], Any]:
    """One step of the converted model ``name`` in ``mode`` (MODES), as benchmarks/models.py runs it."""
    torch.manual_seed(0)
    model = BUILDERS[name]().to(memory_format=torch.channels_last)
    ot.convert(model)
    inference = mode.startswith("inference")
    model.train(not inference)
    if "fused" in mode:
        model = ot.fuse(model)
    labels = torch.arange(x.shape[0]) % CLASSES
    step = models.inference_step if inference else models.training_step
    return step(model, x, labels, ot.functional_calls())


def report(name: str, mode: str, batch: int, size: int, count: int) -> None:
    """Print ``count`` steps of ``name`` in ``mode``: host ms and what the opendnn calls did."""
    x = torch.randn(batch, 3, size, size).contiguous(memory_format=torch.channels_last)
    step = model_step(name, mode, x)
    print(f"{name} {mode} ({batch} x 3 x {size} x {size}, bf16 autocast, channels_last)")
    print(f"  {'step':>4} {'host ms':>8} {'replays':>7} {'full':>5} {'recorded':>8} {'fallbacks':>9} {'waits':>5}")
    for k in range(count):
        counts = Counts()
        with counts.counting():
            start = time.thread_time()
            step()
            host_ms = (time.thread_time() - start) * 1e3
        fallbacks = sum(counts.fallbacks.values())
        waits = sum(counts.waits.values())
        print(
            f"  {k:4} {host_ms:8.1f} {counts.replays:7} {counts.full:5} {counts.recordings:8} {fallbacks:9} {waits:5}"
        )
        if k == count - 1:
            for reason, calls in counts.fallbacks.most_common():
                print(f"    fallback x{calls}: {reason}")
            for wait, calls in counts.waits.most_common():
                print(f"    wait x{calls}: {wait}")
