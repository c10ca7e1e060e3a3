"""Batch normalization: the float64 reference against torch on the CPU (running statistics after
several training steps included) and against finite differences, the error rules, the size
queries, and the Pythonic API on both backends."""

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.batch_norm import problem as bn

EPS = 1e-5
SPATIAL, PER_ACTIVATION = od.BatchNormMode.SPATIAL, od.BatchNormMode.PER_ACTIVATION
BACKENDS = ["numpy", "triton"]


def desc(t):
    return od.TensorDescriptor(t.dtype, t.shape, t.stride())


def random(*shape, low=-2.0, high=3.0, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).uniform(low, high, shape))


# ---- the reference against torch and finite differences ----------------------------------------


def test_reference_training_steps_match_torch_running_statistics():
    scale, bias = random(5, seed=1), random(5, seed=2)
    mean, var = np.zeros((1, 5, 1, 1)), np.ones((1, 5, 1, 1))
    torch_mean, torch_var = torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
    for step in range(4):
        x = random(3, 5, 4, 2, seed=10 + step) * (step + 1)
        expected = TF.batch_norm(x, torch_mean, torch_var, scale, bias, True, 0.1, EPS)
        out = bn.forward_training(
            x.numpy(),
            scale.numpy().reshape(1, 5, 1, 1),
            bias.numpy().reshape(1, 5, 1, 1),
            EPS,
            SPATIAL,
            factor=0.1,
            running_mean=mean,
            running_var=var,
        )
        mean, var = out["running_mean"], out["running_var"]
        np.testing.assert_allclose(out["y"], expected.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mean.ravel(), torch_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(var.ravel(), torch_var.numpy(), rtol=1e-12)


def test_reference_inference_matches_torch():
    x, scale, bias = random(4, 3, 5), random(3, seed=1), random(3, seed=2)
    mean, var = random(3, seed=3), random(3, low=0.5, high=2.0, seed=4)
    expected = TF.batch_norm(x, mean, var, scale, bias, False, 0.1, EPS)
    actual = bn.forward_inference(x.numpy(), *(t.numpy().reshape(1, 3, 1) for t in (scale, bias, mean, var)), EPS)
    np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-12, atol=1e-12)


def test_reference_per_activation_is_batch_norm_of_the_flattened_features():
    x, scale, bias = random(6, 2, 3, 2), random(1, 2, 3, 2, seed=1), random(1, 2, 3, 2, seed=2)
    expected = TF.batch_norm(x.reshape(6, -1), None, None, scale.reshape(-1), bias.reshape(-1), True, 0.1, EPS)
    out = bn.forward_training(x.numpy(), scale.numpy(), bias.numpy(), EPS, PER_ACTIVATION)
    np.testing.assert_allclose(out["y"].reshape(6, -1), expected.numpy(), rtol=1e-12, atol=1e-12)


def test_reference_backward_matches_torch_autograd_with_add_and_relu():
    x, z, dy = (
        random(3, 4, 3, 3).requires_grad_(),
        random(3, 4, 3, 3, seed=5).requires_grad_(),
        random(3, 4, 3, 3, seed=6),
    )
    scale, bias = random(4, seed=1).requires_grad_(), random(4, seed=2).requires_grad_()
    torch.relu(TF.batch_norm(x, None, None, scale, bias, True, 0.1, EPS) + z).backward(dy)
    s4 = scale.detach().numpy().reshape(1, 4, 1, 1)
    forward = bn.forward_training(
        x.detach().numpy(),
        s4,
        bias.detach().numpy().reshape(1, 4, 1, 1),
        EPS,
        SPATIAL,
        z=z.detach().numpy(),
        activation="relu",
    )
    for saved in (True, False):
        stats = dict(mean=forward["mean"], inv_std=forward["inv_std"]) if saved else {}
        out = bn.backward(x.detach().numpy(), dy.numpy(), s4, EPS, SPATIAL, mask=forward["mask"], **stats)
        np.testing.assert_allclose(out["dx"], x.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["dz"], z.grad.numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["dscale"].ravel(), scale.grad.numpy(), rtol=1e-10)
        np.testing.assert_allclose(out["dbias"].ravel(), bias.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("mode", [SPATIAL, PER_ACTIVATION])
def test_reference_backward_matches_finite_differences(mode):
    rng = np.random.default_rng(3)
    x, z, w = rng.normal(size=(3, 2, 2, 2)), rng.normal(size=(3, 2, 2, 2)), rng.normal(size=(3, 2, 2, 2))
    pshape = bn.derive_bn_tensor_descriptor(od.TensorDescriptor("float64", x.shape), mode).dims
    scale, bias = rng.uniform(0.5, 2, pshape), rng.normal(size=pshape)

    def loss(x, scale, bias, z):
        return float(
            (w * bn.forward_training(x, scale, bias, EPS, mode, z=z, activation="clipped_relu", coef=1.0)["y"]).sum()
        )

    forward = bn.forward_training(x, scale, bias, EPS, mode, z=z, activation="clipped_relu", coef=1.0)
    out = bn.backward(x, w, scale, EPS, mode, mask=forward["mask"])
    for name, array, grad in (
        ("x", x, out["dx"]),
        ("scale", scale, out["dscale"]),
        ("bias", bias, out["dbias"]),
        ("z", z, out["dz"]),
    ):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            h = 1e-6
            args = {"x": x, "scale": scale, "bias": bias, "z": z}
            plus, minus = {k: v.copy() for k, v in args.items()}, {k: v.copy() for k, v in args.items()}
            plus[name][index] += h
            minus[name][index] -= h
            numeric[index] = (loss(**plus) - loss(**minus)) / (2 * h)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-6, err_msg=name)


# ---- errors -----------------------------------------------------------------------------------------


def training_call(handle, mode=SPATIAL, param_dims=(1, 3, 1, 1), epsilon=EPS, scale_elements=3, **ex):
    x = random(2, 3, 4, 4).float()
    y = torch.empty_like(x)
    param = od.TensorDescriptor("float32", param_dims)
    scale = torch.ones(scale_elements)
    bias, mean, var = torch.zeros(3), torch.zeros(3), torch.ones(3)
    if not ex:
        return od.batch_normalization_forward_training(
            handle, mode, 1.0, 0.0, desc(x), x, desc(y), y, param, scale, bias, 0.1, mean, var, epsilon
        )
    return od.batch_normalization_forward_training_ex(
        handle,
        mode,
        ex["ops"],
        1.0,
        0.0,
        desc(x),
        x,
        ex.get("z_desc"),
        ex.get("z"),
        desc(y),
        y,
        param,
        scale,
        bias,
        0.1,
        mean,
        var,
        epsilon,
        None,
        None,
        ex.get("act"),
        None,
        ex.get("reserve"),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(mode=PER_ACTIVATION),
            r"bn_scale_bias_mean_var_desc.dims=\[1, 3, 1, 1\] must equal \[1, 3, 4, 4\] for mode=PER_ACTIVATION",
        ),
        (
            dict(param_dims=(1, 4, 1, 1)),
            r"bn_scale_bias_mean_var_desc.dims=\[1, 4, 1, 1\] must equal \[1, 3, 1, 1\] for mode=SPATIAL",
        ),
        (dict(epsilon=-1e-6), r"epsilon=-1e-06 must be at least 0.0"),
        (dict(scale_elements=2), r"bn_scale_desc reaches 3 elements but bn_scale holds 2"),
        (
            dict(ops=od.BatchNormOps.BN_ADD_ACTIVATION, act=od.ActivationDescriptor(od.ActivationMode.RELU)),
            r"z_desc=None but bn_ops=BN_ADD_ACTIVATION needs it",
        ),
        (
            dict(
                ops=od.BatchNormOps.BN_ADD_ACTIVATION,
                act=od.ActivationDescriptor(od.ActivationMode.RELU),
                z_desc=od.TensorDescriptor("float32", (2, 3, 4, 4)),
                reserve=torch.empty(96, dtype=torch.uint8),
            ),
            r"^z=None but bn_ops=BN_ADD_ACTIVATION needs it",
        ),
        (dict(ops=od.BatchNormOps.BN_ACTIVATION), r"activation_desc=None but bn_ops=BN_ACTIVATION needs one"),
        (
            dict(ops=od.BatchNormOps.BN_ACTIVATION, act=od.ActivationDescriptor(od.ActivationMode.TANH)),
            r"activation_desc.mode=TANH must be RELU, CLIPPED_RELU or IDENTITY",
        ),
        (
            dict(ops=od.BatchNormOps.BN_ACTIVATION, act=od.ActivationDescriptor(od.ActivationMode.RELU)),
            r"reserve_space=None but get_batch_normalization_training_ex_reserve_space_size needs 96 bytes",
        ),
    ],
)
def test_errors_name_the_parameter_and_rule(kwargs, message):
    with pytest.raises((od.BadParam, od.NotSupported), match=message):
        training_call(od.create("cpu"), **kwargs)


def test_backward_refuses_one_saved_statistic_without_the_other():
    x = random(2, 3, 4).float()
    param = od.derive_bn_tensor_descriptor(desc(x), SPATIAL)
    with pytest.raises(od.BadParam, match="saved_mean and saved_inv_variance must be given together"):
        od.batch_normalization_backward(
            od.create("cpu"),
            SPATIAL,
            1,
            0,
            1,
            0,
            desc(x),
            x,
            desc(x),
            x,
            desc(x),
            torch.empty_like(x),
            param,
            torch.ones(3),
            torch.empty(3),
            torch.empty(3),
            EPS,
            torch.zeros(3),
            None,
        )


def test_derived_descriptor_by_mode_and_dtype():
    x = od.TensorDescriptor("bfloat16", (8, 6, 5, 7), None)
    assert od.derive_bn_tensor_descriptor(x, SPATIAL) == od.TensorDescriptor("float32", (1, 6, 1, 1))
    assert od.derive_bn_tensor_descriptor(x, PER_ACTIVATION).dims == (1, 6, 5, 7)
    assert od.derive_bn_tensor_descriptor(od.TensorDescriptor("float64", (2, 3)), SPATIAL).dtype is od.DataType.DOUBLE


@pytest.mark.parametrize("backend, reserve", [("numpy", 64 * 5 * 9), ("triton", 368)])
def test_reserve_space_holds_the_mask(backend, reserve):
    x = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "float16", 64, 5, 3, 3)
    act = od.ActivationDescriptor(od.ActivationMode.RELU)
    handle = od.create("cpu", backend=backend)
    get_size = od.get_batch_normalization_training_ex_reserve_space_size
    assert get_size(handle, SPATIAL, od.BatchNormOps.BN_ADD_ACTIVATION, act, x) == reserve
    assert get_size(handle, SPATIAL, od.BatchNormOps.BN, None, x) == 0


# ---- the Pythonic API and the Triton kernels' layouts ------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_functional_training_steps_match_torch(backend, channels_last):
    handle = od.create("cpu", backend=backend)
    weight, bias = random(5, seed=1).float(), random(5, seed=2).float()
    mean, var = torch.zeros(5), torch.ones(5)
    torch_mean, torch_var = torch.zeros(5), torch.ones(5)
    for step in range(3):
        x = random(2, 5, 3, 4, seed=step).float() * (step + 1)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.2, handle=handle)
        expected = TF.batch_norm(x, torch_mean, torch_var, weight, bias, True, 0.2, EPS)
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, torch_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var, torch_var, rtol=1e-5, atol=1e-6)
    y = F.batch_norm(x.numpy() if not channels_last else x, mean, var, weight, bias, handle=handle)
    torch.testing.assert_close(torch.as_tensor(y), TF.batch_norm(x, mean, var, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_backward_matches_torch_autograd(backend):
    handle = od.create("cpu", backend=backend)
    x, dy = random(3, 4, 2, 3).float().requires_grad_(), random(3, 4, 2, 3, seed=7).float()
    weight, bias = random(4, seed=1).float().requires_grad_(), random(4, seed=2).float().requires_grad_()
    TF.batch_norm(x, None, None, weight, bias, True).backward(dy)
    dx, dweight, dbias = F.batch_norm_backward(dy, x.detach(), weight.detach(), handle=handle)
    for actual, expected in ((dx, x.grad), (dweight, weight.grad), (dbias, bias.grad)):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_add_relu_forward_and_backward_match_torch_with_dy_in_another_layout(backend):
    handle = od.create("cpu", backend=backend)
    x, z = random(2, 6, 3, 8).float().requires_grad_(), random(2, 6, 3, 8, seed=3).float().requires_grad_()
    dy = random(2, 6, 3, 8, seed=4).float().contiguous(memory_format=torch.channels_last)
    weight, bias = random(6, seed=1).float().requires_grad_(), random(6, seed=2).float().requires_grad_()
    mean, var = torch.zeros(6), torch.ones(6)
    expected = torch.relu(TF.batch_norm(x, torch.zeros(6), torch.ones(6), weight, bias, True) + z)
    expected.backward(dy)
    y, state = F.batch_norm_add_activation(
        x.detach(), z.detach(), mean, var, weight.detach(), bias.detach(), return_state=True, handle=handle
    )
    torch.testing.assert_close(y, expected.detach(), rtol=1e-5, atol=1e-5)
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x.detach(), weight.detach(), state, handle=handle)
    for actual, wanted in ((dx, x.grad), (dz, z.grad), (dweight, weight.grad), (dbias, bias.grad)):
        torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-5)


def test_triton_plan_rows_for_nchw_columns_for_nhwc():
    from opendnn.families.batch_norm.triton_backend import bn_plan

    def plan(format):
        x = od.TensorDescriptor.from_format(format, "float32", 64, 256, 56, 56)
        return bn_plan(
            bn.batch_norm_problem(
                bn.Direction.TRAINING, SPATIAL, x, x, od.derive_bn_tensor_descriptor(x, SPATIAL), EPS
            ),
            False,
        )

    nchw, nhwc = plan(od.TensorFormat.NCHW), plan(od.TensorFormat.NHWC)
    assert (nchw.block_f, nchw.inner[0], nchw.block_i) == (1, 3136, 256) and nchw.mask_strides == (1, 25088, 0)
    assert (nhwc.block_f, nhwc.inner[0], nhwc.outer_total) == (64, 1, 200704) and nhwc.mask_strides == (256, 1, 0)
    assert nchw.f_blocks * nchw.splits >= 1024 and nhwc.f_blocks * nhwc.splits >= 1024
    # the combine: one load round; NHWC's 256 slices spread over 32 programs of 8 features
    assert (nchw.splits, nchw.combine_blocks) == (4, (64, 4)) and (nhwc.splits, nhwc.combine_blocks) == (256, (8, 256))


@pytest.fixture
def combine_rounds(monkeypatch):
    """The Triton combine's load rounds cut to 8 partial sums (4 slices of 2 features): the slices of
    test_triton_split_statistics_match_torch's NHWC plan take 2 rounds, its features 2 programs."""
    from opendnn.families.batch_norm import triton_backend as triton_bn

    monkeypatch.setattr(triton_bn, "FINAL_TILE", 8)
    monkeypatch.setattr(triton_bn, "FINAL_MIN_BLOCK", 2)
    triton_bn.bn_plan.cache_clear()
    triton_bn.bn_launches.cache_clear()
    yield (2, 4)
    triton_bn.bn_plan.cache_clear()
    triton_bn.bn_launches.cache_clear()


@pytest.mark.parametrize("channels_last", [False, True, "combine_rounds"])
def test_triton_split_statistics_match_torch(channels_last, request):
    """Enough tiles that the statistics pass is cut into slices, combined in the second kernel (in
    several load rounds and programs with the ``combine_rounds`` fixture)."""
    from opendnn.families.batch_norm.triton_backend import bn_plan

    combine_blocks = request.getfixturevalue("combine_rounds") if channels_last == "combine_rounds" else None
    x, z = random(256, 3, 8, 16).float(), random(256, 3, 8, 16, seed=3).float()
    dy = random(256, 3, 8, 16, seed=4).float()
    if channels_last:
        x, z, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, z, dy))
    problem = bn.batch_norm_problem(
        bn.Direction.TRAINING, SPATIAL, desc(x), desc(x), od.TensorDescriptor("float32", (1, 3, 1, 1)), EPS
    )
    assert bn_plan(problem, False).splits > 1
    assert combine_blocks in (None, bn_plan(problem, False).combine_blocks)
    weight, bias = random(3, seed=1).float(), random(3, seed=2).float()
    xr, zr = x.clone().requires_grad_(), z.clone().requires_grad_()
    wr, br = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    expected = torch.relu(TF.batch_norm(xr, None, None, wr, br, True) + zr)
    expected.backward(dy)
    handle = od.create("cpu", backend="triton")
    y, state = F.batch_norm_add_activation(x, z, None, None, weight, bias, return_state=True, handle=handle)
    torch.testing.assert_close(y, expected.detach(), rtol=1e-5, atol=1e-5)
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x, weight, state, handle=handle)
    for actual, wanted in ((dx, xr.grad), (dz, zr.grad), (dweight, wr.grad), (dbias, br.grad)):
        torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_far_from_zero_keep_float32_accuracy(backend):
    handle = od.create("cpu", backend=backend)
    x = (100 + random(4, 3, 4, 4)).float()
    dy = random(4, 3, 4, 4, seed=5).float()
    weight, bias = random(3, seed=1).float(), random(3, seed=2).float()
    expected = TF.batch_norm(x.double(), None, None, weight.double(), bias.double(), True)
    y = F.batch_norm(x, None, None, weight, bias, training=True, handle=handle)
    assert ((y.double() - expected).norm() / expected.norm()).item() < 1e-5
    xr = x.double().requires_grad_()
    TF.batch_norm(xr, None, None, weight.double(), bias.double(), True).backward(dy.double())
    dx = F.batch_norm_backward(dy, x, weight, handle=handle)[0]
    assert ((dx.double() - xr.grad).norm() / xr.grad.norm()).item() < 1e-4


# ---- the one-read training forward (a feature per cluster of CTAs on the GPU, per program here) -------


def test_triton_one_read_split_fits_a_feature_in_one_cluster():
    from opendnn.families.batch_norm.triton_backend import _one_read_split

    assert _one_read_split(64, 3136, 16384, 16) == (16, 4, 4096)  # 64 x C x 56 x 56 NCHW on the H200
    assert _one_read_split(64, 784, 16384, 16) == (4, 16, 1024)  # 28 x 28
    assert _one_read_split(64, 784, 8192, 16) == (8, 8, 1024)  # z too: half the lanes per CTA
    assert _one_read_split(64, 12544, 16384, 16) == (0, 0, 0)  # 112 x 112: no cluster holds a feature
    assert _one_read_split(64, 3136, 16384, 1) == (0, 0, 0)  # the interpreter: one program per feature
    assert _one_read_split(3, 32, 16384, 1) == (1, 4, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("plane", [(4, 8), (5, 7)])
def test_triton_one_read_forward_matches_torch(dtype, plane):
    """NCHW planes of 32 and of 35 (rows of any length where no mask is kept): each feature fits one program,
    so the training forward is one launch (statistics, saved statistics, running averages, alpha / beta
    blending of y)."""
    from opendnn.families.batch_norm.triton_backend import bn_launches

    handle = od.create("cpu", backend="triton")
    weight, bias = random(4, seed=1).float(), random(4, seed=2).float()
    mean, var = random(4, seed=3).float(), random(4, low=0.5, high=2.0, seed=4).float()
    torch_mean, torch_var = mean.double(), var.double()
    param = od.TensorDescriptor("float32", (1, 4, 1, 1))
    for step in range(2):
        x = (random(3, 4, *plane, seed=10 + step) * (step + 1)).to(dtype)
        y0 = random(3, 4, *plane, seed=20 + step).to(dtype)
        y = y0.clone()
        saved_mean, saved_inv = torch.full((4,), float("nan")), torch.full((4,), float("nan"))
        od.batch_normalization_forward_training(
            handle,
            SPATIAL,
            0.5,
            0.25,
            desc(x),
            x,
            desc(y),
            y,
            param,
            weight,
            bias,
            0.3,
            mean,
            var,
            EPS,
            saved_mean,
            saved_inv,
        )
        xd = x.double()
        expected = 0.5 * TF.batch_norm(xd, torch_mean, torch_var, weight.double(), bias.double(), True, 0.3, EPS)
        expected += 0.25 * y0.double()
        tolerance = 1e-5 if dtype is torch.float32 else 1e-2
        torch.testing.assert_close(y.double(), expected, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(saved_mean.double(), xd.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
        inv_std = (xd.var((0, 2, 3), unbiased=False) + EPS).rsqrt()
        torch.testing.assert_close(saved_inv.double(), inv_std, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mean.double(), torch_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), torch_var, rtol=1e-5, atol=1e-6)
    problem = bn.batch_norm_problem(bn.Direction.TRAINING, SPATIAL, desc(x), desc(x), param, EPS)
    launches = bn_launches(problem, (True,) * len(bn.BatchNormTensors._fields), False)[0]
    assert [launch.kernel.fn.__name__ for launch in launches] == ["bn_one_read_forward_kernel"]


@pytest.mark.parametrize("plane", [(4, 8), (5, 7)])
def test_triton_one_read_backward_matches_torch(plane):
    """The backward with saved statistics in one launch (NCHW rows of 32 and 35): dx, dscale and dbias
    against float64 autograd, each blended with alpha / beta."""
    from opendnn.families.batch_norm.triton_backend import bn_launches

    handle = od.create("cpu", backend="triton")
    x, dy = random(3, 4, *plane, seed=1).float(), random(3, 4, *plane, seed=2).float()
    weight = random(4, seed=3).float()
    xr, wr = x.double().requires_grad_(), weight.double().requires_grad_()
    TF.batch_norm(xr, None, None, wr, torch.zeros(4, dtype=torch.float64), True, eps=EPS).backward(dy.double())
    saved_mean = x.double().mean((0, 2, 3)).float()
    saved_inv = (x.double().var((0, 2, 3), unbiased=False) + EPS).rsqrt().float()
    dx0, dscale0, dbias0 = random(3, 4, *plane, seed=4).float(), random(4, seed=5).float(), random(4, seed=6).float()
    dx, dscale, dbias = dx0.clone(), dscale0.clone(), dbias0.clone()
    param = od.TensorDescriptor("float32", (1, 4, 1, 1))
    od.batch_normalization_backward(
        handle,
        SPATIAL,
        0.5,
        0.25,
        2.0,
        0.75,
        desc(x),
        x,
        desc(dy),
        dy,
        desc(dx),
        dx,
        param,
        weight,
        dscale,
        dbias,
        EPS,
        saved_mean,
        saved_inv,
    )
    torch.testing.assert_close(dx.double(), 0.5 * xr.grad + 0.25 * dx0.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dscale.double(), 2.0 * wr.grad + 0.75 * dscale0.double(), rtol=1e-5, atol=1e-5)
    expected_dbias = 2.0 * dy.double().sum((0, 2, 3)) + 0.75 * dbias0.double()
    torch.testing.assert_close(dbias.double(), expected_dbias, rtol=1e-5, atol=1e-5)
    problem = bn.batch_norm_problem(
        bn.Direction.BACKWARD,
        SPATIAL,
        desc(x),
        desc(x),
        param,
        EPS,
        dy_desc=desc(dy),
        alpha=0.5,
        beta=0.25,
        alpha_param=2.0,
        beta_param=0.75,
        saved=True,
    )
    launches = bn_launches(problem, (True,) * len(bn.BatchNormTensors._fields), False)[0]
    assert [launch.kernel.fn.__name__ for launch in launches] == ["bn_one_read_backward_kernel"]


def test_triton_workspace_queries_describe_the_calls_problems_as_planned_for_a_gpu():
    """The Ex size queries build the problem the call builds (its relu mask included), so they give what
    the call's plan needs, with thread-block clusters (an odd plane with a mask takes the three passes, an
    even one the one-read kernels) or without: the query has no device, so it gives the larger."""
    from opendnn.families.batch_norm import api
    from opendnn.families.batch_norm import triton_backend as triton_bn

    handle = od.create("cpu", backend="triton")
    ops, act = od.BatchNormOps.BN_ADD_ACTIVATION, od.ActivationDescriptor(od.ActivationMode.RELU)
    for shape, one_read in (((32, 67, 7, 7), 0), ((16, 96, 28, 28), 2)):
        x = od.TensorDescriptor.from_format(od.TensorFormat.NCHW, "float32", *shape)
        param = od.derive_bn_tensor_descriptor(x, SPATIAL)
        forward = api.training_ex_problem(
            SPATIAL, ops, 1.0, 0.0, x, x, x, param, 0.1, EPS, act, running=(True, True), saved=(True, True)
        )
        backward = api.backward_ex_problem(
            SPATIAL, ops, 1.0, 0.0, 1.0, 0.0, x, x, x, x, param, EPS, act, saved=(True, True)
        )
        assert triton_bn.bn_plan(forward, True).one_read[0] == one_read
        queries = (
            od.get_batch_normalization_forward_training_ex_workspace_size(handle, SPATIAL, ops, x, x, x, param, act),
            od.get_batch_normalization_backward_ex_workspace_size(handle, SPATIAL, ops, x, x, x, x, x, param, act),
        )
        for query, problem in zip(queries, (forward, backward)):
            assert query == max(triton_bn.bn_plan(problem, clusters).workspace_bytes for clusters in (False, True))


def test_triton_one_read_prefetch_as_planned_for_a_gpu(monkeypatch):
    """Planned as on a GPU (nothing is run): the one-read kernels ask L2 for a later cluster's tile, one
    prefetch per 64 bytes, in clusters of 4 CTAs or more; the backward writing dx alone only in clusters of 16
    (at 28x28 it ran slower with it)."""
    from opendnn.families.batch_norm import triton_backend as triton_bn

    def plan(shape, dtype, direction, with_z=False):
        x = od.TensorDescriptor.from_format(od.TensorFormat.NCHW, dtype, *shape)
        param = od.derive_bn_tensor_descriptor(x, SPATIAL)
        backward = direction is bn.Direction.BACKWARD
        problem = bn.batch_norm_problem(
            direction, SPATIAL, x, x, param, EPS, dy_desc=x if backward else None, saved=backward
        )
        absent = {"reserve"} | ({"z"} if not with_z else set()) | ({"dy", "dscale", "dbias"} if not backward else set())
        (launch,), _, _ = triton_bn.bn_launches(
            problem, tuple(name not in absent for name in bn.BatchNormTensors._fields), True
        )
        return launch.cluster, launch.options["PREFETCH"]

    training, backward = bn.Direction.TRAINING, bn.Direction.BACKWARD
    monkeypatch.setattr(
        triton_bn,
        "Launch",
        lambda kernel, grid, args, options, cluster=1: types.SimpleNamespace(
            cluster=cluster, options=options, slots=()
        ),
    )  # planned only: a cluster launch cannot be interpreted
    triton_bn.bn_plan.cache_clear()
    triton_bn.bn_launches.cache_clear()
    try:
        assert plan((64, 256, 56, 56), "float32", training) == (16, 16)
        assert plan((64, 256, 56, 56), "bfloat16", training) == (16, 32)
        assert plan((64, 512, 28, 28), "float32", training) == (4, 16)
        assert plan((64, 1024, 14, 14), "float32", training) == (1, 0)
        assert plan((64, 256, 56, 56), "float32", backward) == (16, 16)
        assert plan((64, 512, 28, 28), "float32", backward) == (4, 0)
        assert plan((64, 512, 28, 28), "float32", backward, with_z=True) == (4, 16)
    finally:
        triton_bn.bn_plan.cache_clear()
        triton_bn.bn_launches.cache_clear()
