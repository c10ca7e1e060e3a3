"""The channels-last depthwise backward filter (``filter_depthwise_rows_kernel``) through the
interpreter, against torch's autograd in float64: filter widths 3, 5 and 7, odd sizes, stride 2,
dilation, the next group's loads in flight or not, a channel multiplier, 3-D, beta (its slices
summed in a fixed order: ``test_depthwise_backward_filter_slices_are_summed_in_a_fixed_order``)."""

from __future__ import annotations

import pytest
from test_convolution_kernels import FILTER, check

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.triton_tiles import DEPTHWISE_ROWS_TILES

CASES = [  # (dtype, x_dims, k, filt, options), one reduced channel a group, channels-last
    # 7x7, channels not a multiple of the block, rows not a multiple of the tile, beta
    (DataType.BFLOAT16, (3, 20, 9, 10), 20, (7, 7), dict(pre=(3, 3), beta=0.5)),
    # 5x5 stride 2 and dilation 2 along the width, asymmetric padding, true convolution, alpha
    (
        DataType.FLOAT,
        (3, 6, 11, 9),
        6,
        (5, 5),
        dict(pre=(2, 1), post=(1, 2), stride=(2, 2), dilation=(1, 2), flip=True, alpha=2.0),
    ),
    # 3x3 stride 2 (two x columns enter the window a step), odd width
    (DataType.BFLOAT16, (2, 12, 9, 11), 12, (3, 3), dict(pre=(1, 1), stride=(2, 2))),
    # 3x3 dilation 2 at stride 1 (the row walked in two phases), a channel multiplier of 2, beta
    (DataType.HALF, (2, 5, 8, 9), 10, (3, 3), dict(pre=(2, 2), dilation=(2, 2), margin=16, beta=-1.0)),
    # 5 x 3, a multiplier of 2, stride 2 along the height only
    (DataType.BFLOAT16, (2, 5, 8, 7), 10, (5, 3), dict(pre=(2, 1), stride=(2, 1))),
    # 3-D 3x3x3, stride (2, 1, 2)
    (DataType.FLOAT, (2, 3, 5, 6, 5), 3, (3, 3, 3), dict(pre=(1, 1, 1), stride=(2, 1, 2))),
    # 7x7 on a 3-wide image: the window walks past the row's end
    (DataType.BFLOAT16, (2, 8, 5, 3), 8, (7, 7), dict(pre=(3, 3))),
    # 7x7 stride 2: 21 x columns and dy a group, too many to hold the next group's in flight
    (DataType.FLOAT, (2, 4, 9, 12), 4, (7, 7), dict(pre=(3, 3), stride=(2, 2))),
]


def rows_launch(problem):
    plan = kernels.launch_plan(problem, True, kernels.choose(problem, tma_aligned=True))
    (launch,) = [launch for launch in plan.launches if launch.kernel.__name__ == "filter_depthwise_rows_kernel"]
    return launch


@pytest.mark.parametrize("dtype, x_dims, k, filt, options", CASES)
def test_depthwise_rows_backward_filter_matches_float64(dtype, x_dims, k, filt, options):
    problem = check(FILTER, dtype, x_dims, k, filt, groups=x_dims[1], channels_last=True, **options)
    launch = rows_launch(problem)
    assert launch.options["WIDTH"] == filt[-1]
    stride, dilation = options.get("stride", (1,) * len(filt))[-1], options.get("dilation", (1,) * len(filt))[-1]
    assert launch.options["SHIFT"] == {(1, 1): 1, (2, 2): 1, (2, 1): 2, (1, 2): 1}[stride, dilation]
    assert launch.options["AHEAD"] == ((filt[-1], launch.options["SHIFT"]) != (7, 2))


def test_depthwise_rows_takes_widths_of_its_table_only():
    """A 1 x 9 filter and float64 keep the other kernels."""
    assert 9 not in DEPTHWISE_ROWS_TILES
    wide = check(FILTER, DataType.BFLOAT16, (2, 8, 5, 12), 8, (1, 9), pre=(0, 4), groups=8, channels_last=True)
    double = check(FILTER, DataType.DOUBLE, (2, 8, 7, 7), 8, (3, 3), pre=(1, 1), groups=8, channels_last=True)
    for problem in (wide, double):
        assert kernels.filter_plan(problem).filter_rows == 0
