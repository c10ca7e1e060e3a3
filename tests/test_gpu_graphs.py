"""CUDA graphs: a converted model's inference and its whole training step (forward,
backward, SGD update) captured with ``opendnn.torch.graphs.capture`` and replayed give what the same
steps give eagerly. bf16 autocast (its cast cache off, as torch asks under capture) and
channels_last, like benchmarks/models.py.
"""

import copy

import pytest
import torch
import torch.nn.functional as TF

import opendnn.torch as ot
from opendnn.torch.graphs import capture

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
BATCH, SIZE, CLASSES = 16, 32, 10


def small_cnn() -> torch.nn.Sequential:
    """Every kind of layer ResNet and MobileNet use: strided, depthwise and 1x1 convolutions, batch
    norm, relu / relu6, max pool, global average pool, linear."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(32, 64, 1, bias=False),
        torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, CLASSES),
    ).to(DEVICE, memory_format=torch.channels_last)


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator(DEVICE).manual_seed(1)
    return [
        (
            torch.randn(BATCH, 3, SIZE, SIZE, device=DEVICE, generator=generator).contiguous(
                memory_format=torch.channels_last
            ),
            torch.randint(0, CLASSES, (BATCH,), device=DEVICE, generator=generator),
        )
        for _ in range(count)
    ]


def converted(model: torch.nn.Module) -> torch.nn.Module:
    report = ot.convert(model)
    assert not report.left_alone, str(report)
    return model


def test_inference_replayed_from_a_cuda_graph_equals_eager_bitwise():
    model = converted(small_cnn()).eval()
    data = batches(3)
    static = torch.empty_like(data[0][0])

    def forward() -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return model(static)

    static.copy_(data[0][0])
    graph, logits = capture(forward)
    for x, _ in data:
        static.copy_(x)
        graph.replay()
        replayed = logits.clone()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            expected = model(x)
        assert replayed.shape == (BATCH, CLASSES) and torch.isfinite(replayed).all()
        assert torch.equal(replayed, expected), (replayed - expected).abs().max()


def sgd_step(model: torch.nn.Module):
    """One training step of ``model`` on (x, labels): forward under bf16 autocast, cross-entropy,
    backward, SGD with momentum (one optimizer across calls). Returns the loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            logits = model(x)
        loss = TF.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def test_training_steps_replayed_from_a_cuda_graph_match_eager_steps():
    eager = converted(small_cnn())
    graphed = copy.deepcopy(eager)
    data, warmup = batches(4), 3
    static_x, static_labels = data[0][0].clone(), data[0][1].clone()
    graph_step = sgd_step(graphed)
    graph, loss = capture(lambda: graph_step(static_x, static_labels), warmup)  # warm-up: batch 0, 3 times
    graph_losses = []
    for x, labels in data[1:]:
        static_x.copy_(x)
        static_labels.copy_(labels)
        graph.replay()
        graph_losses.append(loss.clone())

    eager_step = sgd_step(eager)
    for _ in range(warmup):
        eager_step(*data[0])
    eager_losses = [eager_step(x, labels) for x, labels in data[1:]]

    assert all(torch.isfinite(value) for value in graph_losses)
    torch.testing.assert_close(torch.stack(graph_losses), torch.stack(eager_losses), rtol=1e-5, atol=1e-6)
    for (name, ours), (_, theirs) in zip(graphed.state_dict().items(), eager.state_dict().items(), strict=True):
        if ours.is_floating_point():  # parameters, running statistics
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    moved = sum((p - q).abs().sum() for p, q in zip(graphed.parameters(), small_cnn().parameters()))
    assert moved > 0  # the replays trained the parameters
