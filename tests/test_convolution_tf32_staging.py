"""The TMA route's staged copies of a TF32 problem (``triton_tma.staging_launches``) through Triton's
interpreter: each holds the caller's float32 values rounded to TF32 to nearest, ties away from zero
(what ``cvt.rna.tf32.f32`` and cuDNN's TF32 give), laid out as the TMA kernels read them."""

from __future__ import annotations

import numpy as np
import torch
from test_gluon_convolution import DATA, FP32, S, problem

from opendnn.families.convolution import triton_backend as kernels

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


def test_nchw_tf32_backward_data_stages_dy_channels_last_and_the_filter_crsk_rounded_to_tf32():
    prob = problem(direction=DATA, dtype=FP32, allow_tf32=True, channels_last=False, n=2, c=32, size=6, k=64)
    assert kernels.staged(prob) == ("y",) and kernels.packs_filter(prob)
    plan = kernels.launch_plan(prob, True, S.TMA)
    staging = [launch for launch in plan.launches if launch.kernel.__name__ == "tf32_staging_kernel"]
    assert len(staging) == 2
    generator = torch.Generator().manual_seed(7)
    dy = torch.randn(2, 64, 6, 6, generator=generator)
    dy.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    w = torch.randn(64, 32, 3, 3, generator=generator)
    w.view(-1)[-len(SPECIAL) :] = torch.tensor(SPECIAL)
    tensors = {
        "y": dy,
        "w": w,
        "y_staged": torch.full((dy.numel(),), float("nan")),
        "w_packed": torch.full((w.numel(),), float("nan")),
    }
    for launch in staging:
        launch(tensors)
    want_dy = tf32_nearest(dy.permute(0, 2, 3, 1).contiguous().numpy().ravel())  # N, H, W, K
    want_w = tf32_nearest(w.permute(1, 2, 3, 0).contiguous().numpy().ravel())  # C, R, S, K
    for got, want in ((tensors["y_staged"].numpy(), want_dy), (tensors["w_packed"].numpy(), want_w)):
        np.testing.assert_array_equal(got, want)  # NaN where the input's NaN went, nowhere else
