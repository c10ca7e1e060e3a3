"""opendnn's user cache folder: ``OPENDNN_CACHE_DIR``, else the platform's (platformdirs), else
``$XDG_CACHE_HOME/opendnn``, else ``~/.cache/opendnn``; the graph engine's generated kernels and the
convolution algorithm cache live under it; a test run keeps it in its own temporary folder."""

import sys
import tempfile
from pathlib import Path

import pytest

from opendnn.core.cache_folder import user_cache_folder
from opendnn.families.convolution import algorithms

SOURCE = "def fused_kernel():\n    return 7\n"


@pytest.fixture
def no_override(monkeypatch):
    for variable in ("OPENDNN_CACHE_DIR", "OPENDNN_GRAPH_KERNELS", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)


def test_the_override_names_the_folder_and_expands_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENDNN_CACHE_DIR", str(tmp_path / "caches"))
    assert user_cache_folder() == tmp_path / "caches"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OPENDNN_CACHE_DIR", "~/elsewhere")
    assert user_cache_folder() == tmp_path / "elsewhere"


def test_an_empty_override_is_no_override(monkeypatch, tmp_path, no_override):
    monkeypatch.setitem(sys.modules, "platformdirs", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("OPENDNN_CACHE_DIR", "")
    assert user_cache_folder() == tmp_path / "opendnn"


def test_without_platformdirs_the_folder_follows_xdg_then_dot_cache(monkeypatch, tmp_path, no_override):
    monkeypatch.setitem(sys.modules, "platformdirs", None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_folder() == tmp_path / "home" / ".cache" / "opendnn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_folder() == tmp_path / "xdg" / "opendnn"


def test_with_platformdirs_the_folder_is_its_user_cache_dir(no_override):
    platformdirs = pytest.importorskip("platformdirs", reason="platformdirs is not installed")
    assert user_cache_folder() == Path(platformdirs.user_cache_dir("opendnn", appauthor=False))


def test_generated_kernels_go_to_the_cache_folder_unless_their_own_variable_names_another(monkeypatch, tmp_path):
    kernel_library = pytest.importorskip("opendnn.graph.kernel_library", reason="triton is not installed")
    monkeypatch.delenv("OPENDNN_GRAPH_KERNELS", raising=False)
    monkeypatch.setenv("OPENDNN_CACHE_DIR", str(tmp_path / "caches"))
    path = kernel_library.kernel_path(SOURCE)
    assert path.parent == tmp_path / "caches" / "graph_kernels" and path.name.startswith("fused_")
    assert kernel_library.load_kernel(SOURCE)() == 7
    assert path.read_text() == SOURCE
    monkeypatch.setenv("OPENDNN_GRAPH_KERNELS", str(tmp_path / "kernels"))
    assert kernel_library.kernel_path(SOURCE).parent == tmp_path / "kernels"


def test_the_convolution_algorithm_cache_is_in_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENDNN_CACHE_DIR", str(tmp_path))
    assert algorithms.default_cache_file() == tmp_path / "convolution_algorithms.json"


def test_the_test_run_keeps_the_cache_folder_in_its_temporary_folder():
    """conftest's: a test run writes none of opendnn's caches into the user's own cache folder."""
    folder = user_cache_folder().resolve()
    assert folder.is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert folder.name == "opendnn" and folder.parent.name.startswith("opendnn-tests-")
