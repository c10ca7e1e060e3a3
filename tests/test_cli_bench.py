"""``opendnn bench``: problem strings, correctness mode on the CPU against the float64 reference,
performance mode against torch, and every way a problem is refused (exit status 2, a message)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

import numpy as np
import pytest
from test_cli import exit_status

import opendnn
from opendnn.apps import bench

LINE = re.compile(
    r"(?P<problem>.+)  \[(?P<where>[^\]]+)\]  rel\. error (?P<error>\S+) \(bound (?P<bound>\S+)\)  "
    r"(?P<verdict>PASS|FAIL)"
)


def bench_command(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``opendnn bench ARGV``."""
    return exit_status(capsys, "bench", *argv)


# ---- problem strings ---------------------------------------------------------------------------------


def test_sizes_reads_letters_and_numbers():
    parse = bench.sizes("ncdhw", "nc", "n64c256h56w56")
    assert parse("n64c256h56w56").values == {"n": 64, "c": 256, "h": 56, "w": 56}
    assert parse("n2c3d4h5w6").values == {"n": 2, "c": 3, "d": 4, "h": 5, "w": 6}
    assert str(parse("n1c7")) == "n1c7"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("n64x", "each letter must be followed by a number"),
        ("64c3", "each letter must be followed by a number"),
        ("", "each letter must be followed by a number"),
        ("n-2c3", "each letter must be followed by a number"),
        ("N2c3", "each letter must be followed by a number"),
        ("n2c3q4", "q is not among the letters n, c, d, h, w"),
        ("c3n2", "each letter may appear once, in the order n, c, d, h, w"),
        ("n2n3c4", "each letter may appear once, in the order n, c, d, h, w"),
        ("n2h4", "c must be given"),
        ("n2c0w4", "c0: sizes must be positive"),
    ],
)
def test_sizes_refuses_a_malformed_string_naming_the_rule(text, rule):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        bench.sizes("ncdhw", "nc", "n64c256h56w56")(text)
    assert str(refused.value) == f"{text!r} is not a problem size like n64c256h56w56: {rule}"


def test_per_dim_reads_one_value_or_one_per_dim():
    assert bench.per_dim(1, "a positive integer")("2") == (2,)
    assert bench.per_dim(0, "a non-negative integer")("0,1,2") == (0, 1, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="^0 is not a positive integer$"):
        bench.per_dim(1, "a positive integer")("1,0")
    with pytest.raises(argparse.ArgumentTypeError, match="^'' is not a positive integer$"):
        bench.per_dim(1, "a positive integer")("1,")


def test_the_printed_problem_reproduces_itself(capsys):
    status, out, _ = bench_command(
        capsys,
        "conv",
        "--shape",
        "n2c4h6w5",
        "--filter",
        "k3r3s2",
        "--stride",
        "2,1",
        "--pad",
        "1",
        "--groups",
        "1",
        "--dtype",
        "f64",
        "--seed",
        "3",
    )
    assert status == 0
    problem = LINE.fullmatch(out.strip())["problem"]
    assert problem == (
        "conv --shape n2c4h6w5 --filter k3r3s2 --dilation 1 --direction fwd --dtype f64 --groups 1 "
        "--layout nchw --pad 1 --stride 2,1"
    )
    again = bench_command(capsys, *problem.split(), "--seed", "3")
    assert again[0] == 0 and again[1] == out


# ---- correctness mode on the CPU -----------------------------------------------------------------------

CASES = [
    ["conv", "--shape", "n2c4h7w6", "--filter", "k6r3s3", "--pad", "1"],
    [
        "conv",
        "--shape",
        "n2c4h7w6",
        "--filter",
        "k6r3s3",
        "--stride",
        "2",
        "--pad",
        "1,0",
        "--layout",
        "nhwc",
        "--dtype",
        "bf16",
    ],
    [
        "conv",
        "--shape",
        "n2c4h7w6",
        "--filter",
        "k4r3s3",
        "--groups",
        "4",
        "--direction",
        "bwd_data",
        "--layout",
        "nhwc",
    ],
    [
        "conv",
        "--shape",
        "n2c4h7w6",
        "--filter",
        "k6r2s3",
        "--dilation",
        "2",
        "--direction",
        "bwd_filter",
        "--dtype",
        "f16",
    ],
    ["conv", "--shape", "n2c3w9", "--filter", "k2s3", "--dtype", "f64"],
    ["conv", "--shape", "n1c2d4h5w5", "--filter", "k3t2r3s3", "--pad", "1", "--layout", "nhwc"],
    ["matmul", "--shape", "m33n17k40"],
    ["matmul", "--shape", "b3m16n24k8", "--dtype", "bf16"],
    ["pooling", "--shape", "n2c3h9w8", "--window", "3", "--stride", "2", "--pad", "1"],
    [
        "pooling",
        "--shape",
        "n2c3h9w8",
        "--window",
        "3,2",
        "--stride",
        "2",
        "--pad",
        "1",
        "--direction",
        "bwd",
        "--layout",
        "nhwc",
    ],
    ["pooling", "--shape", "n2c3h9w8", "--window", "3", "--pad", "1", "--alg", "avg_exclude_pad", "--dtype", "f16"],
    ["pooling", "--shape", "n2c3w12", "--alg", "avg_include_pad", "--direction", "bwd"],
    ["softmax", "--shape", "n5c37"],
    ["softmax", "--shape", "n3c8h4w5", "--axis", "h", "--alg", "log", "--layout", "nhwc", "--dtype", "bf16"],
    ["softmax", "--shape", "n5c37", "--direction", "bwd"],
    ["softmax", "--shape", "n3c8h4w5", "--alg", "log", "--direction", "bwd", "--dtype", "f64"],
    ["batch_norm", "--shape", "n4c6h5w3"],
    ["batch_norm", "--shape", "n4c6h5w3", "--direction", "fwd_inference", "--layout", "nhwc", "--dtype", "f16"],
    ["batch_norm", "--shape", "n4c6h5w3", "--direction", "bwd", "--dtype", "bf16"],
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(case) for case in CASES])
def test_check_mode_passes_against_the_float64_reference_on_the_cpu(capsys, argv):
    status, out, err = bench_command(capsys, *argv, "--device", "cpu")
    assert status == 0, err
    line = LINE.fullmatch(out.strip())
    assert line, out
    assert line["where"] == "cpu numpy"
    assert line["verdict"] == "PASS"
    assert 0 <= float(line["error"]) <= float(line["bound"])
    dtype = argv[argv.index("--dtype") + 1] if "--dtype" in argv else "f32"
    assert float(line["bound"]) == {"f64": 1e-13, "f32": 1e-5, "f16": 1e-2, "bf16": 1e-2}[dtype]


def test_check_mode_fails_with_status_1_when_opendnn_is_wrong(capsys, monkeypatch):
    """Off by 1% wherever the arrays are torch's (the run under test), exact where they are the
    reference's NumPy arrays."""

    def skewed(args: argparse.Namespace) -> bench.Problem:
        problem = bench.matmul_problem(args)

        def call(arrays, handle):
            exact = problem.opendnn(arrays, handle)
            return exact if isinstance(arrays["a"], np.ndarray) else lambda: exact() * 1.01

        return dataclasses.replace(problem, opendnn=call)

    monkeypatch.setitem(bench.DRIVERS, "matmul", dataclasses.replace(bench.DRIVERS["matmul"], problem=skewed))
    status, out, _ = bench_command(capsys, "matmul", "--shape", "m8n8k8", "--device", "cpu")
    assert status == 1
    line = LINE.fullmatch(out.strip())
    assert line["verdict"] == "FAIL"
    assert float(line["error"]) == pytest.approx(0.01, rel=1e-3)


# ---- bfloat16 on NumPy arrays (no torch) --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["matmul", "--shape", "b3m16n24k8"],
        ["conv", "--shape", "n2c4h7w6", "--filter", "k6r3s3", "--pad", "1", "--layout", "nhwc"],
        ["batch_norm", "--shape", "n4c6h5w3", "--direction", "bwd"],
    ],
    ids=lambda argv: argv[0],
)
def test_bf16_without_torch_runs_on_ml_dtypes_bfloat16_arrays(capsys, monkeypatch, argv):
    pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    monkeypatch.setitem(sys.modules, "torch", None)  # its import now fails, installed or not
    status, out, err = bench_command(capsys, *argv, "--dtype", "bf16", "--device", "cpu")
    assert status == 0, err
    line = LINE.fullmatch(out.strip())
    assert line["where"] == "cpu numpy" and line["verdict"] == "PASS"
    assert 1e-4 < float(line["error"]) <= 1e-2  # bfloat16's rounding of the outputs, not float32's


def test_bf16_operands_without_torch_are_ml_dtypes_bfloat16_in_their_layout():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    problem = bench.Problem({"x": bench.Operand((2, 3, 4, 5))}, None, None)
    arrays = bench.make_arrays(problem, opendnn.DataType.BFLOAT16, True, "cpu", 0, use_torch=False)
    x = arrays["x"]
    assert x.dtype == ml_dtypes.bfloat16 and x.shape == (2, 3, 4, 5) and x.strides[1] == x.itemsize  # channels last
    expected = np.random.default_rng(0).uniform(-1.0, 1.0, (2, 3, 4, 5))  # the values, whatever the layout
    np.testing.assert_allclose(x.astype(np.float64), expected, rtol=2**-8)


def test_bf16_without_torch_or_ml_dtypes_names_the_cpu_extra(capsys, monkeypatch):
    for module in ("torch", "ml_dtypes"):
        monkeypatch.setitem(sys.modules, module, None)
    status, out, err = bench_command(capsys, "matmul", "--shape", "m8n8k8", "--dtype", "bf16", "--device", "cpu")
    assert status == 1 and out == ""
    assert err.strip() == (
        "opendnn bench matmul: error: --dtype bf16 on NumPy arrays (without torch) needs ml_dtypes, "
        "not installed here: pip install 'opendnn[cpu]'"
    )


# ---- performance mode -------------------------------------------------------------------------------


def test_perf_mode_times_opendnn_and_torch_and_prints_their_ratio(capsys):
    status, out, err = bench_command(
        capsys,
        "conv",
        "--shape",
        "n1c4h8w8",
        "--filter",
        "k4r3s3",
        "--mode",
        "perf",
        "--rounds",
        "3",
        "--device",
        "cpu",
    )
    assert status == 0, err
    timing = re.fullmatch(
        r"conv --shape n1c4h8w8 .*  \[cpu numpy\]  opendnn (\S+) ms \((\S+) GFLOP/s\)  "
        r"torch (\S+) ms \((\S+) GFLOP/s\)  torch/opendnn (\S+)x",
        out.strip(),
    )
    assert timing, out
    ours, our_rate, theirs, _, ratio = map(float, timing.groups())
    flops = 2 * 1 * 4 * 6 * 6 * 4 * 3 * 3
    assert our_rate == pytest.approx(flops / (ours * 1e-3) / 1e9, rel=0.01)
    assert ratio == pytest.approx(theirs / ours, rel=0.02)


def test_perf_mode_rates_a_memory_bound_problem_in_gigabytes_per_second(capsys):
    status, out, _ = bench_command(
        capsys,
        "softmax",
        "--shape",
        "n8c64",
        "--direction",
        "bwd",
        "--mode",
        "perf",
        "--rounds",
        "2",
        "--device",
        "cpu",
    )
    assert status == 0
    assert re.search(r"opendnn \S+ ms \(\S+ GB/s\)  torch \S+ ms \(\S+ GB/s\)  torch/opendnn \S+x$", out.strip())


# ---- refused problems ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["conv", "--shape", "n64x", "--filter", "k1s1"],
            "opendnn bench conv: error: argument --shape: 'n64x' is not a problem size like n64c256h56w56: "
            "each letter must be followed by a number",
        ),
        (
            ["matmul", "--shape", "m4n4"],
            "opendnn bench matmul: error: "
            "argument --shape: 'm4n4' is not a problem size like m512n512k512: k must be given",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3z1"],
            "opendnn bench conv: error: argument --filter: 'k4r3s3z1' is not a problem size like k256r3s3: "
            "z is not among the letters k, t, r, s",
        ),
        (["conv", "--shape", "n2c3h4w4"], "opendnn bench conv: error: the following arguments are required: --filter"),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--stride", "0"],
            "opendnn bench conv: error: argument --stride: 0 is not a positive integer",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--pad", "-1"],
            "opendnn bench conv: error: argument --pad: -1 is not a non-negative integer",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--dtype", "f8"],
            "opendnn bench conv: error: "
            "argument --dtype: invalid choice: 'f8' (choose from 'f64', 'f32', 'f16', 'bf16')",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--direction", "bwd"],
            "opendnn bench conv: error: argument --direction: invalid choice: 'bwd' "
            "(choose from 'fwd', 'bwd_data', 'bwd_filter')",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--rounds", "0"],
            "opendnn bench conv: error: argument --rounds: 0 is not a positive integer",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--device", "tpu"],
            "opendnn bench conv: error: argument --device: 'tpu' is not a device: use auto, cpu, cuda or cuda:N",
        ),
        (
            ["conv", "--shape", "n2c3h4", "--filter", "k4r3"],
            "opendnn bench conv: error: --shape n2c3h4: spatial dims must be w, h w or d h w",
        ),
        (
            ["pooling", "--shape", "n2c3"],
            "opendnn bench pooling: error: --shape n2c3: spatial dims must be w, h w or d h w",
        ),
        (
            ["conv", "--shape", "n2c3w4", "--filter", "k4r3s3"],
            "opendnn bench conv: error: --filter k4r3s3 must give exactly k, s for --shape n2c3w4",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--stride", "1,2,3"],
            "opendnn bench conv: error: --stride 1,2,3 needs 1 or 2 values (one per spatial dim h w)",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r3s3", "--groups", "2"],
            "opendnn bench conv: error: --groups 2 must divide c=3 and k=4",
        ),
        (
            ["conv", "--shape", "n2c3h4w4", "--filter", "k4r5s5"],
            "opendnn bench conv: error: "
            "--filter k4r5s5 does not fit --shape n2c3h4w4 with --pad 0,0 and --dilation 1,1",
        ),
        (
            ["pooling", "--shape", "n1c1h4w4", "--window", "2", "--pad", "2"],
            "opendnn bench pooling: error: --window 2,2 with --pad 2,2 must fit --shape n1c1h4w4 and pad at most half "
            "the window",
        ),
        (
            ["softmax", "--shape", "n4c5", "--axis", "h"],
            "opendnn bench softmax: error: --axis h is not a letter of --shape n4c5",
        ),
        (["matmul", "--shape", "m4n4k4", "--layout", "nhwc"], "opendnn: error: unrecognized arguments: --layout nhwc"),
    ],
)
def test_a_refused_problem_exits_with_status_2_and_says_why(capsys, argv, message):
    status, out, err = bench_command(capsys, *argv)
    assert status == 2
    assert err.strip().splitlines()[-1] == message
    assert out == "" and "Traceback" not in err


def test_a_problem_the_library_refuses_exits_with_status_2_and_its_message(capsys, monkeypatch):
    def refused(args: argparse.Namespace) -> bench.Problem:
        def call(arrays, handle):
            raise opendnn.BadParam("w_desc.dims[1]=3 must equal x_desc.dims[1]/groups=4")

        return dataclasses.replace(bench.matmul_problem(args), opendnn=call)

    monkeypatch.setitem(bench.DRIVERS, "matmul", dataclasses.replace(bench.DRIVERS["matmul"], problem=refused))
    status, out, err = bench_command(capsys, "matmul", "--shape", "m4n4k4", "--device", "cpu")
    assert status == 2
    assert err.strip() == "opendnn bench matmul: error: BadParam: w_desc.dims[1]=3 must equal x_desc.dims[1]/groups=4"
    assert out == ""
