"""The optional libraries opendnn uses when they are installed, and the behaviour without each:
scipy (erf), the standard logging conventions, platformdirs and filelock (the algorithm cache),
ml_dtypes (NumPy bfloat16), array-api-compat (the caller's array library), tqdm (progress bars)."""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging
import math
import subprocess
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

import opendnn as od
import opendnn.functional as F
from opendnn.apps.terminal import ProgressBar
from opendnn.core import dtypes, log
from opendnn.core.arrays import bf16_to_float32, bind, float32_to_bf16, torch_view
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.errors import NotSupported
from opendnn.families.convolution import algorithms
from opendnn.families.convolution import numpy_backend as numpy_convolution
from opendnn.families.pointwise import erf as erf_module
from opendnn.samples import relative_error

# ---- erf -----------------------------------------------------------------------------------------


def _erf_points() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate(
        [
            rng.uniform(-6.0, 6.0, 20000),
            rng.normal(0.0, 1.0, 20000),
            np.logspace(-320, 1.5, 2000),  # tiny (subnormal too) up to the tail
            -np.logspace(-320, 1.5, 2000),
            np.linspace(0.46, 0.48, 2001),  # the range boundaries
            np.linspace(3.99, 4.01, 2001),
            np.array([1e300, -1e300, 26.9, 27.1, 5e-324]),
        ]
    )


def test_cody_erf_is_within_a_few_ulp_of_math_erf():
    x = _erf_points()
    expected = np.array([math.erf(v) for v in x])
    ulp = np.abs(erf_module.cody_erf(x) - expected) / np.spacing(np.abs(expected))
    assert np.quantile(ulp, 0.99) <= 1.0
    assert ulp.max() <= 5.0
    outside = (np.abs(x) <= 0.46875) | (np.abs(x) >= 1.0)
    assert ulp[outside].max() <= 2.0


def test_cody_erf_of_specials():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(np.float64).max])
    result = erf_module.cody_erf(x)
    assert np.isnan(result[0])
    assert result[1:].tolist() == [1.0, -1.0, 0.0, -0.0, 1.0]
    assert math.copysign(1.0, result[4]) == -1.0


def test_erf_uses_scipy_when_installed_and_cody_without(monkeypatch):
    scipy_special = pytest.importorskip("scipy.special", reason="scipy is not installed")
    erf_module._implementation.cache_clear()
    try:
        assert erf_module._implementation() is scipy_special.erf
        erf_module._implementation.cache_clear()
        monkeypatch.setitem(sys.modules, "scipy.special", None)  # import fails: the fallback
        assert erf_module._implementation() is erf_module.cody_erf
    finally:
        erf_module._implementation.cache_clear()


def test_erf_keeps_the_dtype_and_matches_math_erf():
    x = np.random.default_rng(3).uniform(-4.0, 4.0, (3, 5)).astype(np.float32)
    result = erf_module.erf(x)
    assert result.dtype == np.float32 and result.shape == (3, 5)
    expected = np.array([math.erf(float(v)) for v in x.ravel()]).reshape(3, 5)
    np.testing.assert_allclose(result, expected, rtol=1e-7)


# ---- logging -------------------------------------------------------------------------------------


@pytest.fixture
def fresh_logger(monkeypatch):
    """The "opendnn" logger as a new process has it: no handlers, no level, set up on first use."""
    logger = logging.getLogger(log.NAME)
    saved = (logger.handlers[:], logger.level, logger.propagate)
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    log.logger.cache_clear()
    yield monkeypatch
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]
    log.logger.cache_clear()


def test_logger_has_only_a_null_handler_and_leaves_level_and_propagation_alone(fresh_logger):
    fresh_logger.delenv("OPENDNN_LOGLEVEL", raising=False)
    logger = log.logger()
    assert [type(h) for h in logger.handlers] == [logging.NullHandler]
    assert logger.level == logging.NOTSET and logger.propagate
    assert not log.enabled(log.INFO)  # the root logger's default level, WARNING


def test_the_application_configures_the_logger(fresh_logger, caplog):
    fresh_logger.delenv("OPENDNN_LOGLEVEL", raising=False)
    with caplog.at_level(logging.INFO, logger=log.NAME):
        desc = od.TensorDescriptor("float32", (2, 2))
        od.scale_tensor(od.create("cpu"), desc, np.full((2, 2), 1.5, np.float32), 2.0)
    assert any("pointwise backend=numpy device=cpu" in r.getMessage() for r in caplog.records)


def test_loglevel_attaches_a_handler_at_that_level(fresh_logger):
    fresh_logger.setenv("OPENDNN_LOGLEVEL", "2")
    fresh_logger.setenv("OPENDNN_LOGDEST", "stdout")
    logger = log.logger()
    stream_handlers = [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]
    assert len(stream_handlers) == 1 and stream_handlers[0].level == logging.WARNING
    assert logger.level == logging.WARNING and logger.propagate
    assert log.enabled(log.WARNING) and not log.enabled(log.INFO)


# ---- relative_error ------------------------------------------------------------------------------


def test_relative_error_is_the_one_definition_the_benchmarks_use():
    sys.path.insert(0, "benchmarks")
    try:
        pytest.importorskip("torch", reason="the benchmarks need torch")
        import run

        assert run.relative_error is relative_error
    finally:
        sys.path.remove("benchmarks")


def test_relative_error_reads_torch_tensors_of_any_dtype():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    expected = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    actual = expected.to(torch.bfloat16) + torch.tensor([0.0, 0.0, 0.5], dtype=torch.bfloat16)
    assert relative_error(actual, expected) == pytest.approx(0.5 / math.sqrt(21.0))
    assert relative_error(np.array([1.0, np.nan]), np.array([1.0, 2.0])) == math.inf


# ---- the convolution algorithm cache: platformdirs, filelock, a key with the versions ---------------


def _convolution_arguments() -> tuple:
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 2.0, (1, 3, 6, 6)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (4, 3, 3, 3)).astype(np.float32)
    y = np.full((1, 4, 4, 4), np.nan, np.float32)

    def desc(a: np.ndarray) -> od.TensorDescriptor:
        return od.TensorDescriptor("float32", a.shape)

    return (desc(x), x, desc(w), w, od.ConvolutionDescriptor(pad=(0, 0), stride=(1, 1), dilation=(1, 1)), desc(y), y)


def test_default_cache_file_is_platformdirs_user_cache_dir_which_follows_xdg(monkeypatch, tmp_path):
    pytest.importorskip("platformdirs", reason="platformdirs is not installed")
    if sys.platform != "linux":
        pytest.skip("XDG_CACHE_HOME is the Linux convention")
    monkeypatch.delenv("OPENDNN_CACHE_DIR", raising=False)  # the test run's own folder, set in conftest
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert algorithms.default_cache_file() == tmp_path / "opendnn" / "convolution_algorithms.json"


def test_default_cache_file_without_platformdirs_is_under_dot_cache(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "platformdirs", None)
    for variable in ("OPENDNN_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert algorithms.default_cache_file() == tmp_path / ".cache" / "opendnn" / "convolution_algorithms.json"


def test_cache_file_from_argument_then_environment_and_empty_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENDNN_ALGORITHM_CACHE", str(tmp_path / "env.json"))
    assert algorithms._cache_file(None) == tmp_path / "env.json"
    assert algorithms._cache_file(str(tmp_path / "arg.json")) == tmp_path / "arg.json"
    assert algorithms._cache_file("") is None
    monkeypatch.setenv("OPENDNN_ALGORITHM_CACHE", "")
    assert algorithms._cache_file(None) is None
    monkeypatch.delenv("OPENDNN_ALGORITHM_CACHE")
    assert algorithms._cache_file(None) == algorithms.default_cache_file()


def test_cache_lock_is_filelock_when_installed(tmp_path):
    filelock = pytest.importorskip("filelock", reason="filelock is not installed")
    path = tmp_path / "sub" / "algorithms.json"
    with algorithms._locked(path):
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(str(path) + ".lock", timeout=0).acquire()
    filelock.FileLock(str(path) + ".lock", timeout=0).acquire().lock.release()


def test_cache_lock_without_filelock_is_fcntl(monkeypatch, tmp_path):
    fcntl = pytest.importorskip("fcntl", reason="no fcntl on this platform")
    monkeypatch.setitem(sys.modules, "filelock", None)
    path = tmp_path / "algorithms.json"
    with algorithms._locked(path), open(str(path) + ".lock", "a") as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(str(path) + ".lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_cache_without_filelock_and_fcntl_still_writes(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "filelock", None)
    monkeypatch.setitem(sys.modules, "fcntl", None)
    path = tmp_path / "algorithms.json"
    od.find_convolution_forward_algorithm(od.create("cpu"), *_convolution_arguments(), cache_path=str(path))
    assert len(json.loads(path.read_text())) == 1


def test_cache_key_holds_the_versions_and_a_stale_entry_is_measured_again(monkeypatch, tmp_path):
    path = tmp_path / "algorithms.json"
    arguments = _convolution_arguments()
    records = od.find_convolution_forward_algorithm(od.create("cpu"), *arguments, cache_path=str(path))
    (key,) = json.loads(path.read_text())
    prefix = f"opendnn{od.__version__}|triton{algorithms._triton_version()}|"
    assert key.startswith(prefix) and "|cpu|" in key
    try:
        assert algorithms._triton_version() == importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        assert algorithms._triton_version() == "none"

    calls = []
    monkeypatch.setattr(numpy_convolution, "run", lambda *a: calls.append(a))
    assert od.find_convolution_forward_algorithm(od.create("cpu"), *arguments, cache_path=str(path)) == records
    assert calls == []  # the entry of this version is reused
    stale = {key.replace(f"opendnn{od.__version__}", "opendnn0.0.0"): json.loads(path.read_text())[key]}
    path.write_text(json.dumps(stale))
    od.find_convolution_forward_algorithm(od.create("cpu"), *arguments, cache_path=str(path))
    assert len(calls) > 0 and len(json.loads(path.read_text())) == 2  # measured, stored beside the stale one


# ---- progress bars: tqdm on a terminal -------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_is_tqdm_on_a_terminal_when_installed():
    pytest.importorskip("tqdm", reason="tqdm is not installed")
    screen = Terminal()
    bar = ProgressBar(screen)
    bar.show(1, 3, "failures: 0", prefix="epoch 1 ")
    bar.line("a message")
    bar.show(3, 3, "failures: 1", prefix="epoch 1 ")
    bar.clear()
    text = screen.getvalue()
    assert "it/s" in text and "3/3" in text and "epoch 1:" in text and "failures: 1" in text  # tqdm's format
    assert "a message\n" in text and "[###" not in text
    assert text.endswith("\r")  # tqdm erases the bar (leave=False)


def test_progress_bar_prints_nothing_but_lines_off_a_terminal_with_tqdm_too():
    log = io.StringIO()
    bar = ProgressBar(log)
    bar.show(1, 3, "note")
    bar.line("done")
    bar.clear()
    assert log.getvalue() == "done\n"


# ---- the caller's array library: array-api-compat ------------------------------------------------


class NamespacedArray:
    """An array of an array-API library (as jax.Array is): it names its namespace."""

    def __array_namespace__(self, api_version=None):
        return SimpleNamespace(__name__="namespaced", from_dlpack=lambda array: ("namespaced", array))


class DLPackOnly:
    """An array that speaks DLPack and names no namespace."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("not read")


def test_result_comes_back_through_the_callers_array_namespace():
    pytest.importorskip("array_api_compat", reason="array-api-compat is not installed")
    result = np.arange(1.0, 4.0)
    assert to_caller_kind(result, NamespacedArray()) == ("namespaced", result)
    assert to_caller_kind(result, np.ones(2)) is result


def test_an_array_of_no_known_namespace_is_refused_with_a_typed_error():
    pytest.importorskip("array_api_compat", reason="array-api-compat is not installed")
    with pytest.raises(NotSupported, match=r"an input of type test_libraries\.DLPackOnly asks for the result"):
        to_caller_kind(np.arange(1.0, 4.0), DLPackOnly())


def test_a_namespace_without_from_dlpack_is_refused_with_a_typed_error():
    pytest.importorskip("array_api_compat", reason="array-api-compat is not installed")

    class NoDLPack:
        def __array_namespace__(self, api_version=None):
            return SimpleNamespace(__name__="nodlpack")

    with pytest.raises(NotSupported, match="as an array of nodlpack, which cannot take it through from_dlpack"):
        to_caller_kind(np.arange(1.0, 4.0), NoDLPack())


def test_torch_results_come_back_as_they_are():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    tensor = torch.arange(1.0, 4.0)
    assert to_caller_kind(tensor, torch.ones(2)) is tensor
    assert torch.equal(to_caller_kind(np.arange(1.0, 4.0), torch.ones(2)), torch.arange(1.0, 4.0, dtype=torch.float64))


def test_without_array_api_compat_the_library_is_guessed_from_the_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "array_api_compat", None)
    library = ModuleType("guessedlib")
    library.from_dlpack = lambda array: ("guessed", array)
    monkeypatch.setitem(sys.modules, "guessedlib", library)
    guessed = type("GuessedArray", (), {"__module__": "guessedlib"})
    result = np.arange(1.0, 4.0)
    assert to_caller_kind(result, guessed()) == ("guessed", result)
    assert to_caller_kind(result, DLPackOnly()) is result  # no from_dlpack in its module: as it is


# ---- NumPy bfloat16: ml_dtypes -------------------------------------------------------------------


@pytest.fixture
def numpy_dtypes_relearnt():
    """DataType.to_numpy looks ml_dtypes up afresh in the test and again after it."""
    dtypes._numpy_dtype.cache_clear()
    yield
    dtypes._numpy_dtype.cache_clear()


def _bfloat16_inputs() -> np.ndarray:
    return np.random.default_rng(11).uniform(-3.0, 3.0, (3, 4)).astype(np.float32)


def test_numpy_bfloat16_results_are_ml_dtypes_arrays(numpy_dtypes_relearnt):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    x = _bfloat16_inputs()
    y = F.transform(x, dtype="bfloat16")
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == x.shape
    np.testing.assert_array_equal(y.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_ml_dtypes_bfloat16_arrays_are_accepted_as_input(numpy_dtypes_relearnt):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    x = _bfloat16_inputs().astype(ml_dtypes.bfloat16)
    y = F.relu(x)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float64), np.maximum(x.astype(np.float64), 0.0))
    back = F.transform(x, dtype="float32", alpha=2.0)
    np.testing.assert_array_equal(back, 2.0 * x.astype(np.float32))


def test_ml_dtypes_bfloat16_arrays_reach_the_triton_kernels_as_torch_bfloat16(numpy_dtypes_relearnt):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = _bfloat16_inputs().astype(ml_dtypes.bfloat16)
    view = torch_view(bind("x", od.TensorDescriptor("bfloat16", x.shape), x))
    assert view.dtype == torch.bfloat16
    np.testing.assert_array_equal(view.double().numpy(), x.astype(np.float64))


def test_without_ml_dtypes_numpy_bfloat16_is_the_uint16_bit_pattern(monkeypatch, numpy_dtypes_relearnt):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    assert od.DataType.BFLOAT16.to_numpy() == np.uint16
    x = _bfloat16_inputs()
    y = F.transform(x, dtype="bfloat16")
    assert y.dtype == np.uint16
    np.testing.assert_array_equal(y, float32_to_bf16(x))
    np.testing.assert_allclose(bf16_to_float32(y), x, rtol=2**-8)


# ---- opendnn check with NumPy alone --------------------------------------------------------------

WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"  # import torch raises ImportError
    "from opendnn.apps.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
    "sys.exit(code)\n"
)


def _check_without_torch(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, "check", "--backend", "numpy", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_check_runs_the_samples_with_numpy_alone():
    result = _check_without_torch("--filter", "convolution_forward[")
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    count = int(summary.split(" of ")[1].split()[0])
    assert count > 30 and summary.startswith(f"{count} of {count} samples pass on cpu (numpy)")
    assert "skipped" not in summary


def test_check_with_numpy_alone_skips_the_samples_that_need_torch_with_a_count():
    result = _check_without_torch("--filter", "matmul[plain]")
    assert result.returncode == 0, result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert " samples pass on cpu (numpy); 2 skipped: they need torch, not installed here" in summary


def test_numpy_backend_samples_use_numpy_arrays(monkeypatch):
    from opendnn.core.samples import Tensors

    tensors = Tensors("cpu", np.random.default_rng(0), use_numpy=True)
    for layout in ("packed", "permuted", "subregion"):
        x = tensors.input((2, 3, 4), od.DataType.FLOAT, layout)
        y = tensors.output((2, 3, 4), od.DataType.FLOAT, layout, None)
        assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.isnan(y).all()
        assert np.all((tensors.values(x) >= -3.0) & (tensors.values(x) <= 3.0) & (tensors.values(x) != 0.0))
    assert tensors.untouched_outside_views()
    y[...] = 1.0  # inside the sub-region view only
    assert tensors.untouched_outside_views()
    y.base[0, 0, 0] = 2.0  # outside it
    assert not tensors.untouched_outside_views()
