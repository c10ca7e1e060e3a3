"""benchmarks/models.py's compiled modes on the CPU: a tiny model and its converted copy, each under
``torch.compile(mode="reduce-overhead")`` (on the CPU, inductor without CUDA graphs), for inference and
a training step; and torch.compile of the operators under autocast, which those modes run."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF

import opendnn.torch as ot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import models  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

nn = torch.nn


class Tiny(nn.Module):
    """conv -> batch norm -> relu -> F.adaptive_avg_pool2d -> linear: modules ``convert`` swaps, and
    calls of the model's own forward that ``functional_calls()`` routes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = (
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.Linear(8, models.CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = TF.adaptive_avg_pool2d(torch.relu(self.norm(self.conv(x))), 1)
        return self.fc(torch.flatten(y, 1))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_compiled_modes_time_each_sides_compiled_model_without_recompiling(fresh_dynamo):
    profiles = []

    def timer(step):
        """Two iterations of the step (the compilations), then two profiled: what they ran."""
        step(), step()
        with torch.profiler.profile() as profiler:
            step(), step()
        profiles.append({event.name for event in profiler.events()})
        return 1.0

    modes = ["inference (compiled)", "training (compiled)"]
    subject = models.images(Tiny, torch.device("cpu"), 2, 8)
    rows = models.measure("tiny", subject, timer, compiled=True, only=modes)
    assert [row["mode"] for row in rows] == modes
    assert all(row["error"] is None and row["ratio"] == 1.0 for row in rows), [row["error"] for row in rows]
    assert rows[0]["rel_err"] < 2e-2  # bf16 autocast on both sides
    torch_inference, our_inference, torch_training, our_training = profiles
    for names in profiles:
        assert any(name.startswith("Torch-Compiled Region") for name in names)
        assert not any("call_user_compiler" in name for name in names)  # no compilation after the first calls
    assert not any(name.startswith("opendnn::") for name in torch_inference | torch_training)
    assert {"opendnn::convolution", "opendnn::batch_norm_inference", "opendnn::adaptive_pool"} <= our_inference
    assert {
        "opendnn::convolution_backward_filter",
        "opendnn::batch_norm_training_backward",
        "opendnn::adaptive_pool_backward",
        "opendnn::activation_backward",
    } <= our_training


def test_a_compiled_converted_model_under_autocast_matches_eager(fresh_dynamo):
    """The operators' autocast kernels under torch.compile's fake tensors (Python dispatcher on): the
    cast happens once, the call goes on below autocast."""
    torch.manual_seed(0)
    model = Tiny().eval()
    ot.convert(model)
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, result = model(x), compiled(x)
    assert result.dtype == torch.bfloat16 and torch.equal(result, expected)
