"""benchmarks/models.py's segmentation model on the CPU: a small U-Net (``benchmarks/unet.py``) converted to
opendnn whole, its upsampling included, timed against torch's through ``measure`` and the command line."""

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import models  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import unet  # noqa: E402
from test_language_model_benchmark import _profiling_timer  # noqa: E402

SMALL = functools.partial(unet.UNet, (8, 16, 32))  # three levels, the 21 classes


def test_the_unet_rows_run_every_layer_on_opendnn_with_a_class_per_pixel():
    profiles: list[set[str]] = []
    subject = models.images(SMALL, torch.device("cpu"), 2, 16, per_pixel=True)
    assert subject.left_to_torch == [] and subject.labels.shape == (2, 16, 16)
    rows = models.measure("unet", subject, _profiling_timer(profiles))
    assert [row["mode"] for row in rows] == ["inference", "training"]
    assert all(row["error"] is None and row["rel_err"] < 2e-2 for row in rows), [row["error"] for row in rows]
    torch_inference, our_inference, torch_training, our_training = profiles
    assert "aten::upsample_bilinear2d" in torch_training
    assert {"opendnn::interpolate", "opendnn::interpolate_backward", "opendnn::max_pool"} <= our_training
    assert not {"aten::upsample_bilinear2d", "aten::cudnn_convolution", "aten::convolution"} & our_training


def test_the_command_line_times_the_unet_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setattr(models.unet, "UNet", SMALL)
    monkeypatch.setattr(models, "_cpu_timer", lambda: lambda step: (step(), 4.0)[1])
    argv = ["--models", "unet", "--device", "cpu", "--batch", "2", "--size", "16", "--modes", "training"]
    assert models.main([*argv, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "models.md").read_text()
    assert "| unet | training | 2 | 16x16 | 4.00 | 4.00 | 500 img/s | 500 img/s | 1.00 |" in table
