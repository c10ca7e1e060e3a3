"""Warmup (opendnn/torch/ahead_of_time.py, opendnn/apps/warmup.py) on the CPU: the problems and
launches collected from a small model's training step without launching are those a real step
dispatches and launches (Triton's interpreter), the step leaves the model as it was, and the
errors of the call and of the command. The compile pool and its cache keys:
tests/test_warmup_sm90.py."""

from __future__ import annotations

import pytest
import torch

import opendnn
import opendnn.torch as odt
from opendnn.apps import cli
from opendnn.core import dispatch
from opendnn.core.default_handle import shared_handle
from opendnn.kernels.launch import Launch
from opendnn.torch.ahead_of_time import collect


@pytest.fixture
def handle(monkeypatch):
    """The shared CPU handle on the Triton backend (its interpreter), with nothing kept yet."""
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    shared = shared_handle("cpu")
    shared.executables.clear()
    shared.plans.clear()
    return shared


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=False),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    odt.convert(model)
    return model


def test_collected_problems_and_launches_are_those_a_real_step_runs(handle, monkeypatch):
    model, x = small_model(), torch.randn(2, 3, 8, 8)
    before = {name: b.clone() for name, b in model.named_buffers()}
    collected = collect(odt.training_step(model, x))
    assert not handle.executables  # the full path: nothing recorded to replay
    for name, buffer in model.named_buffers():  # the kernels that update the statistics did not run
        assert torch.equal(buffer, before[name]) or name.endswith("num_batches_tracked"), name

    real_problems, real_launches = [], []
    run, launch = dispatch._run, Launch.launch
    monkeypatch.setattr(dispatch, "_run", lambda h, op, i, p, t: real_problems.append((op, p)) or run(h, op, i, p, t))
    monkeypatch.setattr(Launch, "launch", lambda self, t: real_launches.append(self.kernel) or launch(self, t))
    odt.training_step(model, x)()
    kinds = {operation for operation, _ in collected.problems}
    assert {"convolution", "batch_norm", "pooling", "matmul"} <= kinds
    assert collected.problems == real_problems
    assert [kernel for kernel, _, _ in collected.launches] == real_launches


def test_warmup_refuses_a_model_without_a_cuda_input():
    model = small_model()
    with pytest.raises(opendnn.BadParam, match="example_input=None: warmup runs the model once"):
        odt.warmup(model)
    with pytest.raises(opendnn.BadParam, match="example_input is on cpu: warmup compiles for the CUDA device"):
        odt.warmup(model, torch.randn(2, 3, 8, 8))


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["--input", "64x3x224x224"], 2, "the following arguments are required: --model"),
        (["--model", "torchvision:resnet50", "--input", "64x3x0"], 2, "'64x3x0' is not an input shape like"),
        (["--model", "m:f", "--input", "2x3", "--jobs", "0"], 2, "0 is not a positive integer"),
    ],
)
def test_warmup_command_line_errors(capsys, argv, status, message):
    with pytest.raises(SystemExit) as exited:
        cli.main(["warmup", *argv])
    assert exited.value.code == status
    assert message in capsys.readouterr().err


def test_warmup_command_needs_a_gpu(capsys):
    assert cli.main(["warmup", "--model", "torchvision:resnet50", "--input", "2x3x32x32"]) == 1
    assert (
        "opendnn warmup: error: warmup compiles the kernels for the current GPU and needs one: "
        "torch sees no CUDA device" in capsys.readouterr().err
    )


def test_warmup_command_names_a_bad_model(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the GPU check, to the model's
    assert cli.main(["warmup", "--model", "resnet50", "--input", "2x3x32x32"]) == 2
    assert "--model 'resnet50' must be MODULE:FUNCTION, like torchvision:resnet50" in capsys.readouterr().err
    assert cli.main(["warmup", "--model", "torch.nn:no_such_model", "--input", "2x3x32x32"]) == 2
    assert "--model torch.nn:no_such_model: torch.nn has no function 'no_such_model'" in capsys.readouterr().err
