"""reduce_tensor: the NumPy reference against torch and closed forms in float64, then the whole API
on both backends (Triton through its interpreter) against the reference: every operator and dtype,
strided and sub-region layouts, alpha/beta with poisoned outputs, NaN options, ties, the split
path through the workspace, and error messages."""

import math

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.families.reduce.api import (
    get_reduction_indices_size,
    get_reduction_workspace_size,
    reduce_tensor,
)
from opendnn.families.reduce.problem import (
    ReduceTensorDescriptor,
    ReduceTensorIndices,
    ReduceTensorOp,
    reference,
)

OPS = list(ReduceTensorOp)
INDEXED = [ReduceTensorOp.MIN, ReduceTensorOp.MAX, ReduceTensorOp.AMAX]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
BACKENDS = ["numpy", "triton"]


def random_input(shape, dtype=torch.float32, seed=0):
    """Uniform magnitudes in [0.5, 1.5] with random signs: never zero."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 0.5 + torch.rand(shape, generator=gen, dtype=torch.float64)
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).double()
    return (magnitude * sign).to(dtype)


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return math.inf
    keep = ~np.isnan(expected)
    scale = np.linalg.norm(expected[keep])
    return np.linalg.norm(actual[keep] - expected[keep]) / (scale if scale > 0 else 1.0)


def run(
    backend,
    op,
    a,
    c,
    *,
    alpha=1.0,
    beta=0.0,
    nan_opt=od.NanPropagation.NOT_PROPAGATE_NAN,
    with_indices=False,
    indices_type=od.DataType.INT32,
    handle=None,
):
    """reduce_tensor with descriptors of the tensors' own strides; returns the indices array."""
    handle = handle or od.create("cpu", backend=backend)
    reduce_desc = ReduceTensorDescriptor(
        op,
        nan_opt=nan_opt,
        indices_type=indices_type,
        indices=ReduceTensorIndices.FLATTENED_INDICES if with_indices else ReduceTensorIndices.NO_INDICES,
    )
    a_desc, c_desc = descriptor(a), descriptor(c)
    indices = None
    if with_indices:
        count = get_reduction_indices_size(handle, reduce_desc, a_desc, c_desc) // indices_type.itemsize
        indices = torch.full((count,), -7, dtype=indices_type.to_torch())
    size = get_reduction_workspace_size(handle, reduce_desc, a_desc, c_desc)
    workspace = torch.full((size,), 255, dtype=torch.uint8) if size else None
    reduce_tensor(handle, reduce_desc, indices, workspace, alpha, a_desc, a, beta, c_desc, c)
    return None if indices is None else indices.reshape(c.shape).numpy()


def expected(op, a, c_dims, *, alpha=1.0, beta=0.0, c_before=None, propagate_nan=False):
    axes = tuple(k for k, (da, dc) in enumerate(zip(a.shape, c_dims)) if dc == 1 and da > 1)
    values, indices = reference(op, a.double().numpy(), axes, propagate_nan)
    if beta != 0.0:
        values = alpha * values + beta * c_before.double().numpy()
    else:
        values = alpha * values
    return values, indices


def check(backend, op, a, c_dims, *, alpha=1.0, beta=0.0, with_indices=None, c=None, **options):
    """Run on a NaN-poisoned C (unless given), compare values and indices with the reference."""
    with_indices = op in INDEXED if with_indices is None else with_indices
    c = torch.full(c_dims, math.nan, dtype=a.dtype) if c is None else c
    c_before = c.clone()
    indices = run(backend, op, a, c, alpha=alpha, beta=beta, with_indices=with_indices, **options)
    propagate = options.get("nan_opt") is od.NanPropagation.PROPAGATE_NAN
    values, reference_indices = expected(
        op, a, c_dims, alpha=alpha, beta=beta, c_before=c_before, propagate_nan=propagate
    )
    error = relative_error(c.double().numpy(), values)
    assert error <= TOLERANCE[a.dtype], f"{op.name} on {backend}: relative error {error:.3g}"
    if with_indices:
        np.testing.assert_array_equal(indices, reference_indices)
    return c, indices


# --- the reference against independent oracles, float64 ---------------------------------------


def _torch_oracle(op, a, axes):
    if op is ReduceTensorOp.ADD:
        return a.sum(dim=axes, keepdim=True)
    if op is ReduceTensorOp.AVG:
        return a.mean(dim=axes, keepdim=True)
    if op is ReduceTensorOp.MIN:
        return a.amin(dim=axes, keepdim=True)
    if op is ReduceTensorOp.MAX:
        return a.amax(dim=axes, keepdim=True)
    if op is ReduceTensorOp.AMAX:
        return a.abs().amax(dim=axes, keepdim=True)
    if op is ReduceTensorOp.NORM1:
        return torch.linalg.vector_norm(a, ord=1, dim=axes, keepdim=True)
    if op is ReduceTensorOp.NORM2:
        return torch.linalg.vector_norm(a, ord=2, dim=axes, keepdim=True)
    factors = torch.where(a == 0, torch.ones_like(a), a) if op is ReduceTensorOp.MUL_NO_ZEROS else a
    for axis in axes:
        factors = factors.prod(dim=axis, keepdim=True)
    return factors


@pytest.mark.parametrize("axes", [(2,), (1,), (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_reference_matches_torch_in_float64(op, axes):
    a = random_input((3, 4, 5), torch.float64, seed=len(axes))
    a[0, 1, 2] = 0.0 if op is ReduceTensorOp.MUL_NO_ZEROS else a[0, 1, 2]  # a zero it must skip
    values, indices = reference(op, a.numpy(), axes)
    np.testing.assert_allclose(values, _torch_oracle(op, a, axes).numpy(), rtol=1e-13)
    if op in INDEXED:
        kept = [k for k in range(3) if k not in axes]
        rows = a.permute(*kept, *axes).reshape(*(a.shape[k] for k in kept), -1)
        rows = rows.abs() if op is ReduceTensorOp.AMAX else rows
        first = rows.argmin(dim=-1) if op is ReduceTensorOp.MIN else rows.argmax(dim=-1)
        np.testing.assert_array_equal(indices.reshape(first.shape), first.numpy())
    else:
        assert indices is None


def test_reference_mul_no_zeros_of_all_zeros_is_one():
    values, _ = reference(ReduceTensorOp.MUL_NO_ZEROS, np.zeros((2, 3)), (1,))
    np.testing.assert_array_equal(values, [[1.0], [1.0]])


def test_reference_indices_pick_the_first_of_ties():
    a = np.array([[2.0, 1.0, 5.0, 1.0, 5.0, -5.0]])
    assert reference(ReduceTensorOp.MIN, a, (1,))[1].item() == 5
    assert reference(ReduceTensorOp.MIN, a[:, :5], (1,))[1].item() == 1
    assert reference(ReduceTensorOp.MAX, a, (1,))[1].item() == 2
    assert reference(ReduceTensorOp.AMAX, a, (1,))[1].item() == 2  # |5| ties with |-5|: first


def _nan_oracle(row, smallest, propagate):
    """min or max of a list with its first index, by a plain loop."""
    if propagate:
        for k, x in enumerate(row):
            if math.isnan(x):
                return math.nan, k
    numbers = [(x, k) for k, x in enumerate(row) if not math.isnan(x)]
    if not numbers:
        return math.nan, 0
    best = min(x for x, _ in numbers) if smallest else max(x for x, _ in numbers)
    return best, next(k for x, k in numbers if x == best)


@pytest.mark.parametrize("propagate", [False, True])
def test_reference_nan_rules_match_a_loop(propagate):
    nan = math.nan
    rows = [[3.0, nan, -1.0, -1.0, nan], [nan, nan, nan, nan, nan], [2.0, 4.0, 4.0, 0.5, 2.0]]
    for op in INDEXED:
        values, indices = reference(op, np.array(rows), (1,), propagate)
        for r, row in enumerate(rows):
            keys = [abs(x) for x in row] if op is ReduceTensorOp.AMAX else row
            value, index = _nan_oracle(keys, op is ReduceTensorOp.MIN, propagate)
            assert (math.isnan(value) and math.isnan(values[r, 0])) or values[r, 0] == value, (op, r)
            assert indices[r, 0] == index, (op, r)


# --- the API on both backends ----------------------------------------------------------------

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_every_op_and_dtype_matches_reference(op, dtype, backend):
    a = random_input((3, 8, 5), dtype, seed=OPS.index(op))
    check(backend, op, a, (3, 1, 5), alpha=1.5)


def _channels_last(n, c, h, w):
    return random_input((n, h, w, c), seed=3).permute(0, 3, 1, 2)  # NCHW dims, NHWC memory


LAYOUTS = {
    "rows": (lambda: random_input((6, 300), seed=1), (6, 1)),
    "columns": (lambda: random_input((40, 3, 32), seed=2), (1, 3, 32)),
    "channels_last_to_c": (lambda: _channels_last(4, 32, 3, 5), (1, 32, 1, 1)),
    "nchw_to_c": (lambda: random_input((4, 6, 3, 5), seed=4), (1, 6, 1, 1)),
    "transposed_reduce_inner": (lambda: random_input((7, 9), seed=5).t(), (1, 7)),
    "transposed_reduce_outer": (lambda: random_input((7, 9), seed=6).t(), (9, 1)),
    "sliced": (lambda: random_input((10, 12, 9), seed=7)[1:9:2, :, 2:7], (4, 1, 5)),
    "reversed_dims_all": (lambda: random_input((5, 6, 7), seed=8).permute(2, 1, 0), (1, 1, 1)),
    "whole_tensor_split": (lambda: random_input((64, 1024), seed=9), (1, 1)),
    "columns_split": (lambda: random_input((4096, 24), seed=10), (1, 24)),
    "no_reduction": (lambda: random_input((3, 4), seed=11), (3, 4)),
}
LAYOUT_OPS = [ReduceTensorOp.ADD, ReduceTensorOp.MAX, ReduceTensorOp.NORM2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", LAYOUT_OPS, ids=[op.name for op in LAYOUT_OPS])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_any_layout_matches_reference(layout, op, backend):
    make, c_dims = LAYOUTS[layout]
    check(backend, op, make(), c_dims)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_in_a_sub_region_is_written_only_there(backend):
    a = random_input((5, 6, 8), seed=12).transpose(1, 2)  # dims (5, 8, 6)
    buffer = torch.full((200,), math.nan)
    c = buffer[3:].as_strided((5, 1, 6), (20, 1, 3))  # every third element, rows 20 apart
    check(backend, ReduceTensorOp.MIN, a, (5, 1, 6), c=c)
    written = torch.zeros(200, dtype=torch.bool)
    written[3:].as_strided((5, 1, 6), (20, 1, 3)).fill_(True)
    assert torch.isnan(buffer[~written]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "op", [ReduceTensorOp.ADD, ReduceTensorOp.AMAX, ReduceTensorOp.AVG], ids=["ADD", "AMAX", "AVG"]
)
def test_alpha_and_beta_blend_with_prior_output(op, dtype, backend):
    a = random_input((4, 7, 3), dtype, seed=13)
    c = random_input((4, 1, 3), dtype, seed=14)
    check(backend, op, a, (4, 1, 3), alpha=0.5, beta=-1.25, c=c)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", [ReduceTensorOp.ADD, ReduceTensorOp.NORM2], ids=["ADD", "NORM2"])
def test_a_double_input_reduces_into_a_bfloat16_output(op, backend):
    a = random_input((3, 8, 5), torch.float64, seed=16)
    c = torch.full((3, 1, 5), math.nan, dtype=torch.bfloat16)
    run(backend, op, a, c)
    values, _ = expected(op, a, (3, 1, 5), alpha=1.0, beta=0.0, c_before=c, propagate_nan=False)
    assert relative_error(c.double().numpy(), values) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_beta_zero_never_reads_poisoned_output(backend):
    a = random_input((6, 300), seed=15)
    c = torch.full((6, 1), math.nan)
    run(backend, ReduceTensorOp.ADD, a, c, beta=0.0)
    assert torch.isfinite(c).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("nan_opt", list(od.NanPropagation), ids=lambda n: n.name)
@pytest.mark.parametrize("op", INDEXED + [ReduceTensorOp.ADD], ids=lambda op: op.name)
def test_nan_inputs_follow_the_nan_option(op, nan_opt, backend):
    a = random_input((4, 9), seed=16)
    a[0, 3] = a[0, 6] = math.nan
    a[2, :] = math.nan  # an all-NaN row
    a[3, 8] = math.nan
    check(backend, op, a, (4, 1), nan_opt=nan_opt)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape, c_dims", [((5, 40), (5, 1)), ((48, 20), (1, 20)), ((64, 1024), (1, 1))], ids=["rows", "columns", "split"]
)
@pytest.mark.parametrize("op", INDEXED, ids=lambda op: op.name)
def test_indices_of_ties_are_the_first(op, shape, c_dims, backend):
    gen = torch.Generator().manual_seed(17)
    a = torch.randint(-3, 4, shape, generator=gen).float()  # few values: many ties
    check(backend, op, a, c_dims, indices_type=od.DataType.INT64)


def test_triton_results_are_bitwise_repeatable():
    a = random_input((64, 1024), seed=18)
    first, second = torch.empty(1, 1), torch.empty(1, 1)
    run("triton", ReduceTensorOp.ADD, a, first)
    run("triton", ReduceTensorOp.ADD, a, second)
    assert torch.equal(first, second)


def test_whole_tensor_reduction_on_triton_uses_workspace_and_numpy_none():
    a_desc, c_desc = od.TensorDescriptor("float32", (64, 1024)), od.TensorDescriptor("float32", (1, 1))
    reduce_desc = ReduceTensorDescriptor(ReduceTensorOp.MAX, indices=ReduceTensorIndices.FLATTENED_INDICES)
    assert get_reduction_workspace_size(od.create("cpu", backend="triton"), reduce_desc, a_desc, c_desc) > 0
    assert get_reduction_workspace_size(od.create("cpu", backend="numpy"), reduce_desc, a_desc, c_desc) == 0
    assert get_reduction_indices_size(od.create("cpu"), reduce_desc, a_desc, c_desc) == 4


# --- errors ------------------------------------------------------------------------------------


def _call(handle, reduce_desc, a_dims, c_dims, *, indices=None, workspace=None):
    a, c = random_input(a_dims), torch.empty(c_dims)
    reduce_tensor(handle, reduce_desc, indices, workspace, 1.0, descriptor(a), a, 0.0, descriptor(c), c)


def test_c_dims_that_are_neither_a_dims_nor_one_are_refused():
    with pytest.raises(od.BadParam, match=r"c_desc.dims\[1\]=3 must equal a_desc.dims\[1\]=4 or 1"):
        _call(od.create("cpu"), ReduceTensorDescriptor(ReduceTensorOp.ADD), (2, 4, 5), (1, 3, 1))
    with pytest.raises(od.BadParam, match=r"c_desc.ndim=2 must equal a_desc.ndim=3"):
        _call(od.create("cpu"), ReduceTensorDescriptor(ReduceTensorOp.ADD), (2, 4, 5), (2, 1))


def test_indices_with_add_are_refused():
    reduce_desc = ReduceTensorDescriptor(ReduceTensorOp.ADD, indices=ReduceTensorIndices.FLATTENED_INDICES)
    with pytest.raises(
        od.BadParam, match="reduce_desc.indices=FLATTENED_INDICES needs op MIN, MAX or AMAX, not op=ADD"
    ):
        _call(od.create("cpu"), reduce_desc, (2, 4), (2, 1), indices=torch.empty(2, dtype=torch.int32))


def test_missing_or_mistyped_indices_are_refused():
    reduce_desc = ReduceTensorDescriptor(ReduceTensorOp.MIN, indices=ReduceTensorIndices.FLATTENED_INDICES)
    with pytest.raises(
        od.BadParam, match="indices=None but reduce_desc.indices=FLATTENED_INDICES needs an array of 2 INT32 elements"
    ):
        _call(od.create("cpu"), reduce_desc, (2, 4), (2, 1))
    with pytest.raises(od.BadParam, match="indices.dtype=int64 must equal indices_desc.dtype=int32"):
        _call(od.create("cpu"), reduce_desc, (2, 4), (2, 1), indices=torch.empty(2, dtype=torch.int64))
    with pytest.raises(od.BadParam, match="indices_type=FLOAT must be INT32 or INT64"):
        ReduceTensorDescriptor(ReduceTensorOp.MIN, indices_type=od.DataType.FLOAT)


def test_workspace_too_small_or_missing_is_refused():
    handle = od.create("cpu", backend="triton")
    reduce_desc = ReduceTensorDescriptor(ReduceTensorOp.ADD)
    needed = get_reduction_workspace_size(
        handle, reduce_desc, od.TensorDescriptor("float32", (64, 1024)), od.TensorDescriptor("float32", (1, 1))
    )
    with pytest.raises(
        od.BadParam, match=f"workspace holds 16 bytes but get_reduction_workspace_size needs {needed} bytes"
    ):
        _call(handle, reduce_desc, (64, 1024), (1, 1), workspace=torch.empty(16, dtype=torch.uint8))
    with pytest.raises(od.BadParam, match=f"workspace=None but get_reduction_workspace_size needs {needed} bytes"):
        _call(handle, reduce_desc, (64, 1024), (1, 1))


def test_compute_type_other_than_float_or_double_is_refused():
    with pytest.raises(od.BadParam, match="compute_type=HALF must be FLOAT or DOUBLE"):
        ReduceTensorDescriptor(ReduceTensorOp.ADD, compute_type=od.DataType.HALF)
