"""Test set-up. Plain ``pytest`` runs the Triton kernels on CPU tensors through Triton's
interpreter; ``pytest -m gpu`` runs them compiled on a CUDA device. The choice must be made
before triton loads, which is before the test modules are collected.

Triton's kernel cache and matplotlib's configuration go to a temporary folder made for the run (unless
the environment names others), and opendnn's caches (the convolution algorithm cache, the graph engine's
generated kernels) go there whatever the environment says, so a test run writes nothing into the home
folder."""

import os
import shutil
import tempfile

import pytest

_RUN_FOLDER = tempfile.mkdtemp(prefix="opendnn-tests-")


def pytest_configure(config):
    if config.option.markexpr.strip() != "gpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_RUN_FOLDER, "triton"))
    os.environ.setdefault("MPLCONFIGDIR", os.path.join(_RUN_FOLDER, "matplotlib"))
    os.environ["OPENDNN_CACHE_DIR"] = os.path.join(_RUN_FOLDER, "opendnn")
    for variable in ("OPENDNN_GRAPH_KERNELS", "OPENDNN_ALGORITHM_CACHE"):  # each would move one cache elsewhere
        os.environ.pop(variable, None)


def pytest_unconfigure(config):
    shutil.rmtree(_RUN_FOLDER, ignore_errors=True)


def pytest_collection_finish(session):
    """A GPU run must run compiled kernels: a test module that sets TRITON_INTERPRET while it is collected
    would turn every GPU test after it into an interpreter run."""
    if session.config.option.markexpr.strip() == "gpu" and os.environ.get("TRITON_INTERPRET") == "1":
        raise pytest.UsageError("TRITON_INTERPRET=1 is set in a GPU run: unset it (a test module must not set it)")


@pytest.fixture
def strict_float32():
    """TF32 off for torch's convolutions and products, hence for opendnn.torch's too."""
    torch = pytest.importorskip("torch")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture
def planned_convolutions(monkeypatch):
    """What each run of the Triton convolution backend planned, in order: (algorithm, strategy, the
    names of its launches' kernels)."""
    from opendnn.families.convolution import triton_backend as kernels

    taken = []
    launch_plan = kernels.launch_plan

    def recording(problem, interpreted, strategy):
        plan = launch_plan(problem, interpreted, strategy)
        taken.append((problem.algo, strategy, [launch.kernel.__name__ for launch in plan.launches]))
        return plan

    monkeypatch.setattr(kernels, "launch_plan", recording)
    return taken
