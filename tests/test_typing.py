"""The package stays type-clean: mypy over the files pyproject.toml names (``[tool.mypy]``: all of
opendnn), as a user's type checker reads opendnn's annotations (py.typed)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_the_configured_files(monkeypatch, tmp_path):
    api = pytest.importorskip("mypy.api")
    monkeypatch.chdir(ROOT)  # the configuration's relative paths
    stdout, stderr, status = api.run(["--cache-dir", str(tmp_path / "cache")])
    assert status == 0, stdout + stderr
