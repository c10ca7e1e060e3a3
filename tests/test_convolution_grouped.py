"""The narrow-group route (triton_grouped) through Triton's interpreter against float64 torch: groups of
2, 8, 16 and 40-56 channels (2 only where the other side is too wide for the direct kernels), in != out
channels a group, 1x1 / 3x3 / 5x5 filters, stride 1 and 2, NHWC and NCHW, sizes that are no multiple
of the tiles, poisoned outputs, beta, the fused epilogue, and a bitwise repeatable backward filter."""

from __future__ import annotations

import pytest
import torch
from test_convolution_kernels import DATA, FILTER, FWD, check, make

from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionBwdFilterAlgo, ConvolutionFwdAlgo
from opendnn.families.convolution.triton_grouped import GROUPED_MAX_CHANNELS, grouped_splits
from opendnn.families.pointwise.problem import PointwiseMode

F32, BF16, F64 = DataType.FLOAT, DataType.BFLOAT16, DataType.DOUBLE
GROUPED = kernels.Strategy.GROUPED
CASES = {  # name: (dtype, x_dims, k, filter, options); groups of c / groups in, k / groups out
    "8_per_group_3x3_nhwc_bf16": (BF16, (2, 32, 5, 7), 32, (3, 3), dict(pre=(1, 1), groups=4, channels_last=True)),
    "16_per_group_3x3_s2_nchw_beta": (
        F32,
        (3, 32, 7, 6),
        32,
        (3, 3),
        dict(pre=(1, 1), stride=(2, 2), groups=2, beta=0.5, alpha=0.75),
    ),
    "8_in_16_out_5x5_flip_nhwc": (
        F32,
        (2, 24, 6, 5),
        48,
        (5, 5),
        dict(pre=(2, 1), groups=3, flip=True, channels_last=True),
    ),
    "16_in_2_out_1x1_s2": (F32, (2, 64, 5, 7), 8, (1, 1), dict(stride=(2, 2), groups=4, channels_last=True)),
    "12_in_6_out_3x3_dilated_float64": (F64, (1, 36, 6, 7), 18, (3, 3), dict(pre=(2, 2), dilation=(2, 2), groups=3)),
    "56_per_group_3x3_nhwc_bf16": (BF16, (2, 112, 5, 6), 112, (3, 3), dict(pre=(1, 1), groups=2, channels_last=True)),
    "40_in_48_out_3x3_s2_nchw": (F32, (2, 80, 7, 5), 96, (3, 3), dict(pre=(1, 1), stride=(2, 2), groups=2)),
}


@pytest.mark.parametrize("direction", [FWD, DATA, FILTER])
@pytest.mark.parametrize("case", list(CASES))
def test_narrow_groups_take_the_grouped_route_and_match_float64(case, direction):
    dtype, x_dims, k, filt, options = CASES[case]
    problem = check(direction, dtype, x_dims, k, filt, **options)  # poisoned output, compared with torch
    assert kernels.choose(problem, tma_aligned=True) is GROUPED


def test_grouped_forward_fuses_bias_residual_and_activation():
    options = dict(pre=(1, 1), groups=4, channels_last=True, bias=True, z=True, act=PointwiseMode.RELU_FWD)
    problem = check(FWD, F32, (2, 32, 6, 5), 32, (3, 3), **options)
    assert kernels.choose(problem, tma_aligned=True) is GROUPED


def test_wider_groups_direct_groups_and_other_algorithms_keep_their_routes():
    wide = GROUPED_MAX_CHANNELS * 2
    assert kernels.choose(check(FWD, F32, (1, 2 * wide, 3, 3), 2 * wide, (1, 1), groups=2), True) is not GROUPED
    # 64 bfloat16 channels a group are whole 128-byte chunks on both sides: the implicit GEMM's tiles
    whole = check(FWD, BF16, (1, 128, 3, 3), 128, (1, 1), groups=2, channels_last=True)
    assert kernels.choose(whole, True) is not GROUPED
    assert (
        kernels.choose(check(FWD, F32, (1, 8, 3, 3), 8, (3, 3), pre=(1, 1), groups=4), True) is kernels.Strategy.DIRECT
    )
    precomputed = dict(groups=4, algo=ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, channels_last=True)
    assert kernels.choose(check(FWD, F32, (1, 32, 3, 3), 32, (1, 1), **precomputed), True) is not GROUPED  # no copy
    gemm = dict(groups=4, algo=ConvolutionBwdFilterAlgo.ALGO_1)
    assert kernels.choose(check(FILTER, F32, (1, 32, 3, 3), 32, (1, 1), **gemm), True) is not GROUPED


def test_grouped_backward_filter_sums_its_slices_bitwise_repeatably():
    x_dims, k, groups = (16, 32, 12, 12), 32, 4  # 2304 pixels: enough for several slices
    problem = check(FILTER, BF16, x_dims, k, (3, 3), pre=(1, 1), groups=groups, channels_last=True, beta=0.5)
    assert kernels.choose(problem, tma_aligned=True) is GROUPED and grouped_splits(problem) > 1
    x = make(x_dims, BF16, channels_last=True, seed=1)[1]
    y = make(problem.y.dims, BF16, channels_last=True, seed=3)[1]
    size = kernels.workspace_size(problem)
    results = []
    for _ in range(2):
        w = make(problem.w.dims, BF16, channels_last=True, seed=2)[1]  # the same prior dw (beta) each run
        space = torch.full((size,), 255, dtype=torch.uint8)  # poisoned partials
        kernels.run(
            problem, x, w, y, workspace=Bound("workspace", TensorDescriptor(DataType.UINT8, (size,)), space, "cpu")
        )
        results.append(w.view.clone())
    assert not results[0].isnan().any()
    assert torch.equal(results[0], results[1])
