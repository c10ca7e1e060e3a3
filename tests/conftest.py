"""Test set-up. Plain ``pytest`` runs the Triton kernels on CPU tensors through Triton's
interpreter; ``pytest -m gpu`` runs them compiled on a CUDA device. The choice must be made
before triton loads, which is before the test modules are collected."""

import os


def pytest_configure(config):
    if config.option.markexpr.strip() != "gpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
