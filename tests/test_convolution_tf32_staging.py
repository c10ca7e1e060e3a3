"""The TMA route's staged copies of a TF32 problem (``triton_tma.staging_launches``) through Triton's
interpreter: each holds the caller's float32 values rounded to TF32 to nearest, ties away from zero
(what ``cvt.rna.tf32.f32`` and cuDNN's TF32 give), laid out as the TMA kernels read them: NCHW
backward data's dy and repacked filter, an NCHW forward's x and KRSC filter (IMPLICIT_PRECOMP_GEMM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gluon_convolution import DATA, FP32, S, problem

import opendnn as od
from opendnn.families.convolution import triton_backend as kernels

PRECOMP = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM

SPECIAL = [
    1.0 + 2.0**-11,  # half a TF32 unit above 1: a tie, away from zero
    -(1.0 + 2.0**-11),
    1.0 + 2.0**-11 - 2.0**-23,  # just below the tie: down
    1.0 + 3 * 2.0**-11,  # the tie above an odd last bit: still away from zero
    3.4028234663852886e38,  # the largest float32: past TF32's largest, infinity
    float("inf"),
    -float("inf"),
    float("nan"),
    1e-40,  # subnormal
    -0.0,
]


def tf32_nearest(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to TF32 by comparing, in float64, the distances to the two TF32
    neighbours (the truncated value and one unit further from zero, 2**128 past the largest, which
    rounds to infinity); ties to the further one."""
    bits = values.view(np.uint32)
    toward_zero = (bits & np.uint32(0xFFFFE000)).view(np.float32)
    away = (bits & np.uint32(0xFFFFE000)) + np.uint32(0x2000)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = values.astype(np.float64)
        away_value = away.view(np.float32).astype(np.float64)
        away_value = np.where(np.isinf(away_value), np.copysign(2.0**128, exact), away_value)
        nearer_away = np.abs(away_value - exact) <= np.abs(exact - toward_zero.astype(np.float64))
    rounded = np.where(nearer_away, away.view(np.float32), toward_zero)
    return np.where(np.isfinite(values), rounded, values)


def test_the_oracle_rounds_ties_away_from_zero_and_past_the_largest_to_infinity():
    got = tf32_nearest(np.array(SPECIAL[:5], dtype=np.float32))
    unit = 2.0**-10
    assert got.tolist() == [1 + unit, -(1 + unit), 1.0, 1 + 2 * unit, float("inf")]


@pytest.mark.parametrize(
    "case, arguments, activation, orders",
    [  # orders: the activation's dims and the filter's, in their copies' memory order
        ("NCHW backward data: dy NHWK, the filter CRSK", dict(direction=DATA), "y", ((0, 2, 3, 1), (1, 2, 3, 0))),
        ("NCHW forward, IMPLICIT_PRECOMP_GEMM: x NHWC, the filter KRSC", dict(algo=PRECOMP), "x", ((0, 2, 3, 1),) * 2),
    ],
)
def test_nchw_tf32_staging_copies_the_activation_and_the_filter_rounded_to_tf32(case, arguments, activation, orders):
    prob = problem(dtype=FP32, allow_tf32=True, channels_last=False, n=2, c=32, size=6, k=64, **arguments)
    assert kernels.staged(prob) == (activation,) and kernels.packs_filter(prob)
    plan = kernels.launch_plan(prob, True, S.TMA)
    staging = [launch for launch in plan.launches if launch.kernel.__name__ == "staging_kernel"]
    assert [launch.args[0].name for launch in staging] == [f"{activation}_staged", "w_packed"]
    generator = torch.Generator().manual_seed(7)
    source = torch.randn(2, 64 if activation == "y" else 32, 6, 6, generator=generator)  # dy has K channels
    source.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    w = torch.randn(64, 32, 3, 3, generator=generator)
    w.view(-1)[-len(SPECIAL) :] = torch.tensor(SPECIAL)
    tensors = {
        activation: source,
        "w": w,
        f"{activation}_staged": torch.full((source.numel(),), float("nan")),
        "w_packed": torch.full((w.numel(),), float("nan")),
    }
    for launch in staging:
        launch(tensors)
    for got, original, order in zip((tensors[f"{activation}_staged"], tensors["w_packed"]), (source, w), orders):
        want = tf32_nearest(original.permute(*order).contiguous().numpy().ravel())
        np.testing.assert_array_equal(got.numpy(), want)  # NaN where the input's NaN went, nowhere else


def test_a_forward_under_implicit_gemm_stages_nothing():
    prob = problem(dtype=FP32, allow_tf32=True, channels_last=False, n=2, c=32, size=6, k=64)
    assert kernels.staged(prob) == () and not kernels.packs_filter(prob) and kernels.tma_blocks(prob) is None
