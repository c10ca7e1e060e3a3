"""Batch norm's fused activation at a NaN pre-activation: 0 by default (cuDNN's NOT_PROPAGATE_NAN), NaN
with propagate_nan, forward and backward (the gradient there follows the pointwise relu backward: NaN
with propagation, 0 without), on the NumPy backend and both Triton designs, against the float64
reference."""

import numpy as np
import pytest

import opendnn as od
import opendnn.functional as F
from opendnn.families.batch_norm import problem as bn
from opendnn.families.batch_norm import triton_backend

EPS = 1e-5
SPATIAL = od.BatchNormMode.SPATIAL
C = 4
# backend, plane (H, W), the Triton design the plane takes: a mask byte holds 8 lanes of one row, so an
# NCHW plane of 35 takes the three passes, one of 32 the one-read kernels (one program per feature)
CASES = [
    ("numpy", (5, 7), None),
    ("triton", (5, 7), ("bn_reduce_kernel", "bn_combine_kernel", "bn_forward_kernel")),
    ("triton", (4, 8), ("bn_one_read_forward_kernel",)),
]
BACKWARD_KERNELS = {
    "bn_forward_kernel": ("bn_reduce_kernel", "bn_combine_kernel", "bn_backward_kernel"),
    "bn_one_read_forward_kernel": ("bn_one_read_backward_kernel",),
}


def random(*shape, seed):
    return np.random.default_rng(seed).uniform(-2.0, 3.0, shape).astype(np.float32)


def nan_inputs(plane, with_z):
    """x, z, weight, bias, dy: with z, two NaN in z's channel 2 (those pre-activations alone are NaN);
    without, a NaN in x's channel 1 (its statistics, so all its pre-activations, are NaN). The other
    channels stay finite."""
    shape = (3, C, *plane)
    x, z, dy = random(*shape, seed=1), random(*shape, seed=2), random(*shape, seed=3)
    if with_z:
        z[0, 2, 1, 2] = z[2, 2, 3, 0] = np.nan
    else:
        x[1, 1, 2, 3] = np.nan
    return x, (z if with_z else None), random(C, seed=4) + 0.5, random(C, seed=5), dy


def reference(x, z, weight, bias, dy, activation, coef, propagate_nan):
    """(y, dx, dz, dweight, dbias) in float64."""
    x64, z64, dy64 = (None if a is None else a.astype(np.float64) for a in (x, z, dy))
    scale, shift = (a.astype(np.float64).reshape(1, C, 1, 1) for a in (weight, bias))
    forward = bn.forward_training(
        x64, scale, shift, EPS, SPATIAL, z=z64, activation=activation, coef=coef, propagate_nan=propagate_nan
    )
    grads = bn.backward(
        x64, dy64, scale, EPS, SPATIAL, mean=forward["mean"], inv_std=forward["inv_std"], mask=forward["mask"]
    )
    return forward["y"], grads["dx"], grads["dz"], grads["dscale"].reshape(C), grads["dbias"].reshape(C)


def assert_matches(actual, expected, name):
    actual = np.asarray(actual, dtype=np.float64)
    assert np.array_equal(np.isnan(actual), np.isnan(expected)), f"{name}: NaN in other places than the reference's"
    finite = ~np.isnan(expected)
    assert finite.any(), f"{name}: nothing finite to compare"
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-4, atol=1e-4, err_msg=name)


def launched(x_desc, z_desc, activation, coef, propagate_nan, direction, dy_desc=None):
    """The Triton kernels the call's problem launches (on a device without clusters)."""
    ops = od.BatchNormOps.BN_ADD_ACTIVATION if z_desc is not None else od.BatchNormOps.BN_ACTIVATION
    param = bn.derive_bn_tensor_descriptor(x_desc, SPATIAL)
    problem = bn.batch_norm_problem(
        direction,
        SPATIAL,
        x_desc,
        x_desc,
        param,
        EPS,
        ops=ops,
        z_desc=z_desc,
        dy_desc=dy_desc,
        activation=activation,
        activation_coef=coef,
        propagate_nan=propagate_nan,
        saved=True,
        update_running=direction is bn.Direction.TRAINING,
        reserve=True,
    )
    given = tuple(z_desc is not None or name != "z" for name in bn.BatchNormTensors._fields)
    return tuple(launch.kernel.fn.__name__ for launch in triton_backend.bn_launches(problem, given, False)[0])


@pytest.mark.parametrize("backend, plane, kernels", CASES, ids=["numpy", "triton-three-pass", "triton-one-read"])
@pytest.mark.parametrize("with_z", [True, False], ids=["add", "no-add"])
@pytest.mark.parametrize("activation, coef", [("relu", None), ("clipped_relu", 1.5)], ids=["relu", "clipped_relu"])
@pytest.mark.parametrize("propagate_nan", [True, False], ids=["propagate", "not-propagate"])
def test_nan_pre_activations_forward_and_backward_match_the_reference(
    backend, plane, kernels, with_z, activation, coef, propagate_nan
):
    handle = od.create("cpu", backend=backend)
    x, z, weight, bias, dy = nan_inputs(plane, with_z)
    y, state = F.batch_norm_add_activation(
        x,
        z,
        np.zeros(C, np.float32),
        np.ones(C, np.float32),
        weight,
        bias,
        activation=activation,
        coef=coef,
        propagate_nan=propagate_nan,
        return_state=True,
        handle=handle,
    )
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(
        dy,
        x,
        weight,
        state,
        EPS,
        activation=activation,
        coef=coef,
        propagate_nan=propagate_nan,
        has_z=with_z,
        handle=handle,
    )
    expected = reference(x, z, weight, bias, dy, activation, coef or 0.0, propagate_nan)
    nan_y = np.isnan(expected[0])
    assert nan_y.any() == propagate_nan  # the inputs reach the activation with NaN: kept or made 0
    results = (y, dx, dz, dweight, dbias) if with_z else (y, dx, None, dweight, dbias)
    for name, actual, wanted in zip(("y", "dx", "dz", "dweight", "dbias"), results, expected):
        if actual is not None:
            assert_matches(actual, wanted, name)
    if kernels is not None:
        x_desc = od.TensorDescriptor("float32", x.shape)
        z_desc = x_desc if with_z else None
        assert launched(x_desc, z_desc, activation, coef or 0.0, propagate_nan, bn.Direction.TRAINING) == kernels
        backward = launched(x_desc, z_desc, activation, coef or 0.0, propagate_nan, bn.Direction.BACKWARD, x_desc)
        assert backward == BACKWARD_KERNELS[kernels[-1]]


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_a_plain_backward_of_a_propagating_forward_gives_0_at_nan(backend):
    """The reserve space of a propagating forward also serves a backward without propagation (NaN kept
    forward, gradient 0 there)."""
    handle = od.create("cpu", backend=backend)
    x, z, weight, bias, dy = nan_inputs((5, 7), True)
    _, state = F.batch_norm_add_activation(
        x, z, None, None, weight, bias, propagate_nan=True, return_state=True, handle=handle
    )
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x, weight, state, EPS, handle=handle)
    _, *expected = reference(x, z, weight, bias, dy, "relu", 0.0, False)
    for name, actual, wanted in zip(("dx", "dz", "dweight", "dbias"), (dx, dz, dweight, dbias), expected):
        assert not np.isnan(wanted).any()
        assert_matches(actual, wanted, name)


def test_the_triton_reserve_space_holds_a_nan_plane_with_propagation():
    handle = od.create("cpu", backend="triton")
    x_desc = od.TensorDescriptor("float32", (64, 5, 3, 3))  # 576 mask bits per feature: 72 bytes, 360 in all
    sizes = [
        od.get_batch_normalization_training_ex_reserve_space_size(
            handle,
            SPATIAL,
            od.BatchNormOps.BN_ACTIVATION,
            od.ActivationDescriptor(od.ActivationMode.RELU, nan_opt),
            x_desc,
        )
        for nan_opt in (od.NanPropagation.NOT_PROPAGATE_NAN, od.NanPropagation.PROPAGATE_NAN)
    ]
    assert sizes == [368, 720]


def test_the_activation_descriptors_nan_option_keys_the_problem():
    x_desc = od.TensorDescriptor("float32", (2, C, 3, 3))
    param = bn.derive_bn_tensor_descriptor(x_desc, SPATIAL)
    problems = [
        bn.batch_norm_problem(
            bn.Direction.TRAINING,
            SPATIAL,
            x_desc,
            x_desc,
            param,
            EPS,
            ops=od.BatchNormOps.BN_ACTIVATION,
            activation=activation,
            propagate_nan=propagate_nan,
        )
        for activation in ("relu", "identity")
        for propagate_nan in (False, True)
    ]
    assert [p.propagate_nan for p in problems] == [False, True, False, False]  # identity has no NaN rule
    assert problems[0] != problems[1] and hash(problems[0]) != hash(problems[1])
