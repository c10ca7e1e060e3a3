"""The ``opendnn`` command: version, help, argument errors (exit status 2 with a message, never a
traceback), missing optional packages, ``check``'s table, exit status and progress bar, and the
rule that the library never imports its applications."""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import opendnn
from opendnn.apps import cli
from opendnn.apps.command_line import CommandError, create_handle
from opendnn.apps.terminal import ProgressBar, table
from opendnn.samples import Sample

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "opendnn"


def opendnn_command(*argv: str, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python -m opendnn ARGV`` in a fresh interpreter, as if the ``blocked`` packages were not
    installed (each import of one raises ModuleNotFoundError)."""
    block = "".join(f"sys.modules[{name!r}] = None; " for name in blocked)
    code = f"import runpy, sys; {block}sys.argv[1:] = {list(argv)!r}; runpy.run_module('opendnn', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def exit_status(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``opendnn ARGV`` run in this process."""
    try:
        status = cli.main(list(argv))
    except SystemExit as leaving:
        status = leaving.code if isinstance(leaving.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ---- version and help ---------------------------------------------------------------------------


def test_python_dash_m_opendnn_prints_the_version():
    result = opendnn_command("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"opendnn {opendnn.__version__}"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def test_every_option_of_every_command_has_help_and_shows_its_default():
    parsers = _parsers(cli.build_parser())
    assert {p.prog for p in parsers} >= {
        "opendnn demo",
        "opendnn check",
        "opendnn bench conv",
        "opendnn bench batch_norm",
        "opendnn info",
    }
    for parser in parsers:
        shown = re.sub(r"\s+", " ", parser.format_help())  # as one line: wrapping may break anywhere
        assert "``" not in shown, parser.prog  # no raw reST markup
        for action in parser._actions:
            if not action.option_strings or action.default is argparse.SUPPRESS:
                continue  # --help, --version and required options have no default
            option = f"{parser.prog} {action.option_strings[0]}"
            assert action.help, f"{option} has no help"
            default = f"({re.escape(str(action.default))}|{re.escape(repr(action.default))})"
            assert re.search(rf"\(default: {default}[,)]", shown), option


def test_an_unknown_command_is_a_usage_error(capsys):
    status, _, err = exit_status(capsys, "train")
    assert status == 2
    assert "invalid choice: 'train'" in err


# ---- demo ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "0"], "argument --epochs: 0 is not a positive integer"),
        (["--batch-size", "0"], "argument --batch-size: 0 is not a positive integer"),
        (["--batch-size", "many"], "argument --batch-size: 'many' is not a positive integer"),
        (["--seed", "-1"], "argument --seed: -1 is not a non-negative integer"),
        (["--device", "gpu"], "argument --device: 'gpu' is not a device: use auto, cpu, cuda or cuda:N"),
    ],
)
def test_demo_refuses_bad_values_with_exit_status_2(capsys, argv, message):
    status, out, err = exit_status(capsys, "demo", *argv)
    assert status == 2
    assert f"opendnn demo: error: {message}" in err
    assert "Traceback" not in err and out == ""


def test_demo_refuses_a_cuda_device_that_does_not_exist(capsys):
    count = torch.cuda.device_count()  # cuda:<count> is one past the last device on any machine
    status, _, err = exit_status(capsys, "demo", "--device", f"cuda:{count}")
    assert status == 2
    assert f"argument --device: cuda:{count} does not exist: torch {torch.__version__} sees {count} CUDA device" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA on a machine without it")
def test_demo_on_cuda_without_a_cuda_device_is_a_usage_error(capsys):
    status, _, err = exit_status(capsys, "demo", "--device", "cuda")
    assert status == 2
    assert "argument --device: cuda does not exist" in err


def test_demo_without_scikit_learn_names_the_extra_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # its import now fails, installed or not
    status, out, err = exit_status(capsys, "demo", "--epochs", "1", "--device", "cpu")
    assert status == 1
    assert err.strip() == (
        "opendnn demo: error: the digits demo needs scikit-learn, not installed here: pip install 'opendnn[demo]'"
    )
    assert out == ""  # refused before any training


# ---- check -----------------------------------------------------------------------------------------


def test_check_runs_the_filtered_samples_and_prints_an_aligned_table(capsys):
    status, out, err = exit_status(capsys, "check", "--device", "cpu", "--filter", "set_tensor")
    assert status == 0, err
    lines = out.splitlines()
    header, rows = lines[0], [line for line in lines[1:] if line.startswith("set_tensor")]
    assert len(rows) == 5
    for column in ("variant", "dtype", "shape", "layout", "backend"):  # left-aligned: starts line up
        assert all(row[header.index(column) - 1] == " " and row[header.index(column)] != " " for row in rows), column
    end = header.index("rel. error") + len("rel. error")  # right-aligned: ends line up
    assert all(re.fullmatch(r" \d\.\d\de[+-]\d\d", row[end - 9 : end]) for row in rows)
    assert lines[-1] == "5 of 5 samples pass on cpu (numpy)"
    assert "\r" not in err  # stderr is not a terminal here: no progress bar


def test_check_table_fits_names_longer_than_any_fixed_column(capsys, monkeypatch):
    def runner(sample, tensors, handle):
        return np.ones(3), np.ones(3)

    wide = Sample(
        "an_operation_name_longer_than_twenty_characters",
        "a_variant_name_wider_than_the_old_column_of_28",
        opendnn.DataType.FLOAT,
        (2, 3),
        runner=runner,
    )
    monkeypatch.setattr(cli, "samples", lambda: iter([wide]))
    status, out, _ = exit_status(capsys, "check", "--device", "cpu")
    assert status == 0
    header, row = out.splitlines()[:2]
    assert row.index("a_variant_name") == header.index("variant")
    assert row.index("float32") == header.index("dtype")


def test_check_fails_with_status_1_when_a_sample_is_wrong_or_raises(capsys, monkeypatch):
    def wrong(sample, tensors, handle):
        return np.full(4, 1.1), np.ones(4)

    def refused(sample, tensors, handle):
        raise opendnn.BadParam("x_desc.dims[1]=3 must equal y_desc.dims[1]=4")

    chosen = [
        Sample("op_a", "wrong", opendnn.DataType.FLOAT, (4,), runner=wrong),
        Sample("op_b", "refused", opendnn.DataType.FLOAT, (4,), runner=refused),
    ]
    monkeypatch.setattr(cli, "samples", lambda: iter(chosen))
    status, out, err = exit_status(capsys, "check", "--device", "cpu")
    assert status == 1
    assert "op_b[refused]-float32-4-packed: BadParam: x_desc.dims[1]=3 must equal y_desc.dims[1]=4" in err
    assert re.search(r"op_a +wrong .* 1\.00e-01 +FAIL", out)
    assert out.splitlines()[-1] == "0 of 2 samples pass on cpu (numpy)"


def test_check_with_a_filter_that_matches_nothing_is_a_usage_error(capsys):
    status, out, err = exit_status(capsys, "check", "--device", "cpu", "--filter", "no_such_operation")
    assert status == 2
    assert re.fullmatch(r"opendnn check: error: --filter 'no_such_operation' matches none of the \d+ samples\n", err)
    assert out == ""


def test_check_with_numpy_alone_skips_the_samples_needing_torch_and_counts_them():
    # fp8 arrays need torch: NumPy has no fp8 dtype
    result = opendnn_command("check", "--filter", "float8_e4m3fn", blocked=("torch", "triton"))
    assert "Traceback" not in result.stderr
    assert result.stdout.strip() == (
        "0 of 0 samples pass on cpu (numpy); 4 skipped: they need torch, not installed here (pip install torch)"
    )
    assert result.stderr.strip() == "opendnn check: error: no sample ran: install what the skipped samples need"
    assert result.returncode == 1


def test_check_stops_quietly_when_its_reader_has_left():
    """stdout is a pipe whose reading end is closed (``opendnn check | head -1`` once head is done)."""
    code = (
        "import os, runpy, sys; read, write = os.pipe(); os.close(read); os.dup2(write, 1); "
        "sys.argv[1:] = ['check', '--device', 'cpu', '--filter', 'set_tensor']; "
        "runpy.run_module('opendnn', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 1
    assert result.stderr == ""  # no traceback, no "Exception ignored ... BrokenPipeError"


def test_check_on_the_triton_backend_without_triton_names_the_extra_to_install():
    result = opendnn_command("check", "--backend", "triton", "--filter", "set_tensor", blocked=("torch", "triton"))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "opendnn check: error: --backend triton needs torch and triton, not installed here: pip install 'opendnn[gpu]'"
    )


def test_the_numpy_backend_on_a_cuda_device_is_a_usage_error():
    with pytest.raises(CommandError) as refused:
        create_handle("cuda:0", "numpy")  # refused before any CUDA call: runs on any machine
    assert refused.value.status == 2
    assert str(refused.value) == (
        "--device cuda:0 --backend numpy: backend='numpy' runs on the CPU only, not on device='cuda:0'"
    )


def test_info_names_numpy_alone_when_torch_and_triton_are_missing():
    result = opendnn_command("info", blocked=("torch", "triton"))
    assert result.returncode == 0, result.stderr
    assert "torch   not installed" in result.stdout
    assert "backends: numpy\n" in result.stdout


# ---- terminal output --------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_redraws_in_place_on_a_terminal_and_stays_silent_elsewhere(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # the hand-drawn bar, as without tqdm
    screen = Terminal()
    bar = ProgressBar(screen, width=4)
    bar.show(1, 2, "note")
    bar.show(2, 2)
    bar.line("done")
    assert screen.getvalue() == "\r[##..] 1/2  note\r[####] 2/2      \rdone      \n"
    log = io.StringIO()
    quiet = ProgressBar(log, width=4)
    quiet.show(1, 2, "note")
    quiet.line("done")
    quiet.clear()
    assert log.getvalue() == "done\n"


def test_table_columns_are_as_wide_as_their_widest_cell():
    assert table(("name", "ms"), [("a", "1.5"), ("longer name", "12.25")], right=("ms",)) == [
        "name            ms",
        "a              1.5",
        "longer name  12.25",
    ]


# ---- layering ----------------------------------------------------------------------------------------


def _imported_modules(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, at any depth of its code, with
    relative imports made absolute."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_library_never_imports_the_applications():
    """Everything but opendnn/apps (and ``python -m opendnn``'s entry point) works without the
    applications."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "apps") or path == PACKAGE / "__main__.py":
            continue
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        bad = {m for m in _imported_modules(path.read_text(), package) if m.split(".")[:2] == ["opendnn", "apps"]}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"library modules import opendnn.apps: {offenders}"


def test_the_import_scan_sees_absolute_relative_and_nested_imports():
    source = "import numpy\ndef f():\n    from ..apps import demo\n    import opendnn.apps.cli\nfrom . import x\n"
    assert _imported_modules(source, "opendnn.torch") == {
        "numpy",
        "opendnn.apps",
        "opendnn.apps.demo",
        "opendnn.apps.cli",
        "opendnn.torch",
        "opendnn.torch.x",
    }
