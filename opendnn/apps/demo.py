"""``opendnn demo``: train a small CNN on scikit-learn's 8x8 digits with nothing but opendnn.

The network (conv 3x3 -> batch norm -> relu -> max pool 2x2, twice, then a linear layer and a
softmax cross-entropy) runs its forward and backward passes and its SGD updates through
``opendnn.functional``: the NumPy backend on the CPU, the Triton kernels on a CUDA device. Only the
data handling (shuffling, batching, reshapes, the accuracy count) is NumPy.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import opendnn.functional as F
from opendnn.apps.command_line import add_device_option, non_negative_int, positive_int
from opendnn.apps.terminal import ProgressBar

CLASSES = 10
DESCRIPTION = """\
Trains a small CNN (conv 3x3 -> batch norm -> relu -> max pool, twice, then linear and softmax
cross-entropy) on scikit-learn's 8x8 digits with nothing but opendnn's forward and backward calls:
the NumPy backend on the CPU, the Triton kernels on a CUDA device. Writes a plot of loss and
accuracy per epoch to OUT/demo_training.png."""
PACKAGES = {"sklearn": "scikit-learn", "matplotlib": "matplotlib"}  # import name: distribution


@dataclass
class Parameter:
    value: Any
    grad: Any = None
    velocity: Any = None


@dataclass
class Conv:
    """conv 3x3 (padding 1, no bias: batch norm follows) -> batch norm -> relu -> max pool 2x2."""

    weight: Parameter
    scale: Parameter
    shift: Parameter
    running_mean: Any
    running_var: Any
    saved: dict[str, Any] = field(default_factory=dict)

    def forward(self, x: Any, training: bool) -> Any:
        conv = F.conv(x, self.weight.value, padding=1)
        normed = F.batch_norm(
            conv,
            self.running_mean,
            self.running_var,
            self.scale.value,
            self.shift.value,
            training=training,
            momentum=0.1,
            eps=1e-5,
        )
        active = F.relu(normed)
        pooled = F.max_pool(active, 2)
        self.saved = {"x": x, "conv": conv, "normed": normed, "active": active, "pooled": pooled}
        return pooled

    def backward(self, dpooled: Any) -> Any:
        s = self.saved
        dactive = F.max_pool_backward(dpooled, s["active"], s["pooled"], 2)
        dnormed = F.relu_backward(dactive, s["normed"])
        dconv, self.scale.grad, self.shift.grad = F.batch_norm_backward(
            dnormed, s["conv"], self.scale.value, eps=1e-5
        )  # batch statistics recomputed from conv
        self.weight.grad = F.conv_backward_filter(s["x"], dconv, self.weight.value.shape, padding=1)
        return F.conv_backward_data(dconv, self.weight.value, s["x"].shape, padding=1)

    def parameters(self) -> list[Parameter]:
        return [self.weight, self.scale, self.shift]


@dataclass
class Linear:
    """y = x @ weight.T + bias."""

    weight: Parameter  # (out, in)
    bias: Parameter
    ones: Any  # (1, batch): sums dy over the batch as a matrix product
    saved: Any = None

    def forward(self, x: Any, training: bool) -> Any:
        self.saved = x
        return F.linear(x, self.weight.value, self.bias.value)

    def backward(self, dy: Any) -> Any:
        self.weight.grad = F.matmul(dy.T, self.saved)
        self.bias.grad = F.matmul(self.ones[:, : dy.shape[0]], dy).reshape(-1)
        return F.matmul(dy, self.weight.value)

    def parameters(self) -> list[Parameter]:
        return [self.weight, self.bias]


class Network:
    """Two Conv blocks (1 -> 16 -> 32 channels, 8x8 -> 4x4 -> 2x2), then Linear(128 -> 10)."""

    def __init__(self, rng: np.random.Generator, device: Device, batch_size: int) -> None:
        def conv_block(c_in: int, c_out: int) -> Conv:
            weight = rng.normal(0.0, np.sqrt(2.0 / (9 * c_in)), (c_out, c_in, 3, 3))
            return Conv(
                Parameter(device.array(weight)),
                Parameter(device.array(np.ones(c_out))),
                Parameter(device.array(np.zeros(c_out))),
                device.array(np.zeros(c_out)),
                device.array(np.ones(c_out)),
            )

        linear_weight = rng.normal(0.0, np.sqrt(1.0 / 128), (CLASSES, 128))
        self.blocks = [conv_block(1, 16), conv_block(16, 32)]
        self.head = Linear(
            Parameter(device.array(linear_weight)),
            Parameter(device.array(np.zeros(CLASSES))),
            device.array(np.ones((1, batch_size))),
        )

    def forward(self, x: Any, training: bool) -> Any:
        """Log-probabilities (batch, 10)."""
        for block in self.blocks:
            x = block.forward(x, training)
        self.features_shape = x.shape
        logits = self.head.forward(x.reshape(x.shape[0], -1), training)
        return F.log_softmax(logits, 1)

    def backward(self, log_probs: Any, dlog_probs: Any) -> None:
        dx = self.head.backward(F.log_softmax_grad(dlog_probs, log_probs, 1))
        dx = dx.reshape(self.features_shape)
        for block in reversed(self.blocks):
            dx = block.backward(dx)

    def parameters(self) -> list[Parameter]:
        return [p for block in self.blocks for p in block.parameters()] + self.head.parameters()


def sgd_step(parameters: list[Parameter], learning_rate: float, momentum: float) -> None:
    """v = momentum * v + grad; p = p - learning_rate * v (all opendnn pointwise calls)."""
    for p in parameters:
        p.velocity = p.grad if p.velocity is None else F.add(F.transform(p.velocity, alpha=momentum), p.grad)
        p.value = F.sub(p.value, F.transform(p.velocity, alpha=learning_rate))


@dataclass(frozen=True)
class Device:
    """Where arrays live: NumPy arrays on the CPU, torch tensors on a CUDA device."""

    name: str

    def array(self, values: np.ndarray) -> Any:
        values = np.ascontiguousarray(values, dtype=np.float32)
        if self.name == "cpu":
            return values
        import torch

        return torch.from_numpy(values).to(self.name)

    @staticmethod
    def numpy(array: Any) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else array.detach().cpu().numpy()


def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits scaled to [0, 1], split 80 / 20 with ``seed``."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(seed).permutation(len(images))
    split = int(0.8 * len(images))
    train, test = order[:split], order[split:]
    return images[train], digits.target[train], images[test], digits.target[test]


@dataclass
class History:
    loss: list[float] = field(default_factory=list)
    train_accuracy: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)


def train(
    epochs: int,
    batch_size: int,
    seed: int,
    device: Device,
    learning_rate: float = 0.05,
    momentum: float = 0.9,
    progress: ProgressBar | None = None,
) -> History:
    """Trains the network with SGD (momentum) and returns its loss and accuracies per epoch;
    ``progress`` shows a bar per epoch and a summary line after each."""
    train_x, train_y, test_x, test_y = load_digits(seed)
    rng = np.random.default_rng(seed)
    net = Network(rng, device, batch_size)
    history = History()
    batches = (len(train_x) + batch_size - 1) // batch_size
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(train_x))
        total_loss, correct = 0.0, 0
        for step in range(batches):
            chosen = order[step * batch_size : (step + 1) * batch_size]
            one_hot = np.eye(CLASSES, dtype=np.float32)[train_y[chosen]]
            log_probs = net.forward(device.array(train_x[chosen]), training=True)
            net.backward(log_probs, device.array(-one_hot / len(chosen)))  # d(mean NLL) / d log_probs
            sgd_step(net.parameters(), learning_rate, momentum)
            host = device.numpy(log_probs)
            total_loss -= float((host * one_hot).sum())
            correct += int((host.argmax(1) == train_y[chosen]).sum())
            if progress:
                progress.show(
                    step + 1,
                    batches,
                    f"loss {total_loss / ((step + 1) * batch_size):.4f}",
                    prefix=f"epoch {epoch:3d}/{epochs} ",
                )
        history.loss.append(total_loss / len(train_x))
        history.train_accuracy.append(correct / len(train_x))
        history.test_accuracy.append(evaluate(net, device, test_x, test_y, batch_size))
        if progress:
            progress.line(
                f"epoch {epoch:3d}/{epochs}  loss {history.loss[-1]:.4f}  train accuracy "
                f"{history.train_accuracy[-1]:.3f}  test accuracy {history.test_accuracy[-1]:.3f}"
            )
    return history


def evaluate(net: Network, device: Device, images: np.ndarray, labels: np.ndarray, batch_size: int) -> float:
    correct = 0
    for start in range(0, len(images), batch_size):
        log_probs = device.numpy(net.forward(device.array(images[start : start + batch_size]), training=False))
        correct += int((log_probs.argmax(1) == labels[start : start + batch_size]).sum())
    return correct / len(images)


def plot(history: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = range(1, len(history.loss) + 1)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(epochs, history.loss, marker="o")
    left.set(title="training loss (mean cross-entropy)", xlabel="epoch")
    right.plot(epochs, history.train_accuracy, marker="o", label="train")
    right.plot(epochs, history.test_accuracy, marker="o", label="test")
    right.set(title="accuracy", xlabel="epoch", ylim=(0, 1))
    right.legend()
    for axes in (left, right):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(args: argparse.Namespace) -> int:
    """Runs ``opendnn demo`` with the options of ``add_arguments``."""
    device = Device(args.device)
    start = time.perf_counter()
    progress = ProgressBar()
    progress.line(
        f"training on {device.name} ({'NumPy backend' if device.name == 'cpu' else 'Triton kernels'}): "
        f"{args.epochs} epochs, batch {args.batch_size}, seed {args.seed}"
    )
    history = train(args.epochs, args.batch_size, args.seed, device, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "demo_training.png"
    plot(history, path)
    print(
        f"test accuracy {history.test_accuracy[-1]:.3f} after {args.epochs} epochs in "
        f"{time.perf_counter() - start:.1f} s; plot written to {path.resolve()}"
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epochs", type=positive_int, default=10, help="passes over the 1,437 training images")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per SGD step")
    parser.add_argument(
        "--seed", type=non_negative_int, default=0, help="initial weights, train/test split and shuffling"
    )
    add_device_option(parser)
    parser.add_argument("--out", default="demo_output", help="folder the plot is written to")
