"""Batch normalization on a CUDA device (``pytest -m gpu``): the Pythonic API against torch (cuDNN) on the device."""

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_training_forward_and_backward_match_torch_on_gpu(dtype, channels_last):
    x = torch.randn(32, 96, 28, 28, device=DEVICE).mul_(2).add_(1).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.rand(96, device=DEVICE) + 0.5
    bias = torch.randn(96, device=DEVICE)
    mean, var = torch.zeros(96, device=DEVICE), torch.ones(96, device=DEVICE)
    torch_mean, torch_var = mean.clone(), var.clone()
    for _ in range(3):
        y = F.batch_norm(x, mean, var, weight, bias, training=True)
        expected = TF.batch_norm(
            x.double(), torch_mean.double(), torch_var.double(), weight.double(), bias.double(), True
        )
        TF.batch_norm(x.float(), torch_mean, torch_var, weight, bias, True)
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert relative_error(y, expected) < TOLERANCE[dtype]
    assert relative_error(mean, torch_mean) < 1e-5 and relative_error(var, torch_var) < 1e-5
    xr = x.double().requires_grad_()
    wr, br = weight.double().requires_grad_(), bias.double().requires_grad_()
    dy = torch.randn_like(x)
    TF.batch_norm(xr, None, None, wr, br, True).backward(dy.double())
    dx, dweight, dbias = F.batch_norm_backward(dy, x, weight)
    assert relative_error(dx, xr.grad) < TOLERANCE[dtype]
    assert relative_error(dweight, wr.grad) < 1e-4 and relative_error(dbias, br.grad) < 1e-4


@pytest.mark.parametrize("channels_last", [False, True])
def test_training_forward_and_backward_are_bitwise_repeatable_on_gpu(channels_last):
    """The statistics are summed in slices added in a fixed order (no atomics): two calls give the same
    bits (NHWC: 196 slices, combined by 32 programs)."""
    x = torch.randn(64, 256, 28, 28, device=DEVICE).mul_(2).add_(1)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    weight, bias = torch.rand(256, device=DEVICE) + 0.5, torch.randn(256, device=DEVICE)
    runs = []
    for _ in range(2):
        y = F.batch_norm(x, None, None, weight, bias, training=True)
        runs.append((y, *F.batch_norm_backward(dy, x, weight)))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_relu_matches_torch_on_gpu(dtype):
    x = torch.randn(32, 64, 28, 28, device=DEVICE, dtype=dtype).contiguous(memory_format=torch.channels_last)
    z = torch.randn_like(x)
    weight, bias = torch.rand(64, device=DEVICE) + 0.5, torch.randn(64, device=DEVICE)
    xr, zr = x.double().requires_grad_(), z.double().requires_grad_()
    wr, br = weight.double().requires_grad_(), bias.double().requires_grad_()
    pre_activation = TF.batch_norm(xr, None, None, wr, br, True) + zr
    expected = torch.relu(pre_activation)
    dy = torch.randn_like(x)
    y, state = F.batch_norm_add_activation(x, z, None, None, weight, bias, return_state=True)
    assert relative_error(y, expected) < TOLERANCE[dtype]
    # relu's derivative taken where opendnn's forward put it: an element within rounding of 0 may fall
    # on either side, and one such flip moves dx by ~1/sqrt(numel) (the float64 graph knows nothing of it)
    pre_activation.backward(dy.double() * (y > 0))
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x, weight, state)
    assert relative_error(dx, xr.grad) < 2 * TOLERANCE[dtype] and relative_error(dz, zr.grad) < TOLERANCE[dtype]
    assert relative_error(dweight, wr.grad) < 1e-3 and relative_error(dbias, br.grad) < 1e-3


def one_read_cluster(x, with_z=False):
    """CTAs per feature of the one-read training forward planned for ``x`` (0: the three passes)."""
    from opendnn.families.batch_norm import problem as bn
    from opendnn.families.batch_norm.triton_backend import bn_plan
    from opendnn.kernels.device import has_clusters

    x_desc = od.TensorDescriptor(x.dtype, x.shape, x.stride())
    param = od.derive_bn_tensor_descriptor(x_desc, od.BatchNormMode.SPATIAL)
    ops = od.BatchNormOps.BN_ADD_ACTIVATION if with_z else od.BatchNormOps.BN
    problem = bn.batch_norm_problem(
        bn.Direction.TRAINING,
        od.BatchNormMode.SPATIAL,
        x_desc,
        x_desc,
        param,
        1e-5,
        ops=ops,
        z_desc=x_desc if with_z else None,
        activation="relu" if with_z else None,
    )
    return bn_plan(problem, has_clusters(x.device.index)).one_read[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, cluster",
    [
        ((64, 32, 56, 56), 16),
        ((33, 24, 30, 40), 8),
        ((64, 40, 28, 28), 4),
        ((32, 16, 28, 28), 2),
        ((8, 24, 28, 28), 1),
        ((64, 8, 112, 112), 0),
        ((256, 16, 14, 14), 4),
        ((64, 40, 14, 14), 1),
        ((128, 24, 7, 7), 1),
    ],
)
def test_one_read_forward_and_backward_in_clusters_match_torch_on_gpu(dtype, shape, cluster):
    """The training forward and the backward with its saved statistics, each feature in one cluster of CTAs
    (x, and dy, read once), 33 rows of 1200 in 8 CTAs of 8 x 2048 lanes and rows of 196 and 49 included,
    and the three passes where a feature needs more than 16 CTAs (cluster 0): y, the saved statistics, the
    running averages, dx, dscale and dbias against float64."""
    x = torch.randn(shape, device=DEVICE).mul_(2).add_(3).to(dtype)
    assert one_read_cluster(x) == cluster
    channels = shape[1]
    weight, bias = torch.rand(channels, device=DEVICE) + 0.5, torch.randn(channels, device=DEVICE)
    mean, var = torch.randn(channels, device=DEVICE), torch.rand(channels, device=DEVICE) + 0.5
    torch_mean, torch_var = mean.double(), var.double()
    x_desc = od.TensorDescriptor(dtype, shape, x.stride())
    param = od.derive_bn_tensor_descriptor(x_desc, od.BatchNormMode.SPATIAL)
    y = torch.full_like(x, float("nan"))
    saved_mean = torch.full((channels,), float("nan"), device=DEVICE)
    saved_inv = torch.full_like(saved_mean, float("nan"))
    od.batch_normalization_forward_training(
        od.create(DEVICE),
        od.BatchNormMode.SPATIAL,
        1.0,
        0.0,
        x_desc,
        x,
        x_desc,
        y,
        param,
        weight,
        bias,
        0.1,
        mean,
        var,
        1e-5,
        saved_mean,
        saved_inv,
    )
    xd = x.double()
    expected = TF.batch_norm(xd, torch_mean, torch_var, weight.double(), bias.double(), True, 0.1, 1e-5)
    assert relative_error(y, expected) < TOLERANCE[dtype]
    assert relative_error(saved_mean, xd.mean((0, 2, 3))) < 1e-6
    assert relative_error(saved_inv, (xd.var((0, 2, 3), unbiased=False) + 1e-5).rsqrt()) < 1e-6
    assert relative_error(mean, torch_mean) < 1e-6 and relative_error(var, torch_var) < 1e-6
    dy = torch.randn_like(x)
    xr, wr = xd.requires_grad_(), weight.double().requires_grad_()
    TF.batch_norm(xr, None, None, wr, bias.double(), True, eps=1e-5).backward(dy.double())
    dx = torch.full_like(x, float("nan"))
    dweight, dbias = torch.full_like(weight, float("nan")), torch.full_like(weight, float("nan"))
    od.batch_normalization_backward(
        od.create(DEVICE),
        od.BatchNormMode.SPATIAL,
        1.0,
        0.0,
        1.0,
        0.0,
        x_desc,
        x,
        x_desc,
        dy,
        x_desc,
        dx,
        param,
        weight,
        dweight,
        dbias,
        1e-5,
        saved_mean,
        saved_inv,
    )
    assert relative_error(dx, xr.grad) < TOLERANCE[dtype]
    assert relative_error(dweight, wr.grad) < 1e-4 and relative_error(dbias, dy.double().sum((0, 2, 3))) < 1e-5


def test_one_read_add_relu_mask_feeds_the_backward_on_gpu():
    """BN + add + relu, NCHW, forward in clusters of 4 (the relu mask bits written there), backward in
    clusters of 2 reading them: against float64 autograd."""
    x = torch.randn(32, 64, 28, 28, device=DEVICE).mul_(2).add_(1)
    z, dy = torch.randn_like(x), torch.randn_like(x)
    assert one_read_cluster(x, with_z=True) == 4
    weight, bias = torch.rand(64, device=DEVICE) + 0.5, torch.randn(64, device=DEVICE)
    xr, zr = x.double().requires_grad_(), z.double().requires_grad_()
    wr, br = weight.double().requires_grad_(), bias.double().requires_grad_()
    pre_activation = TF.batch_norm(xr, None, None, wr, br, True) + zr
    y, state = F.batch_norm_add_activation(x, z, None, None, weight, bias, return_state=True)
    assert relative_error(y, torch.relu(pre_activation)) < 1e-5
    pre_activation.backward(dy.double() * (y > 0))  # relu's derivative where opendnn's forward put it
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x, weight, state)
    assert relative_error(dx, xr.grad) < 2e-5 and relative_error(dz, zr.grad) < 1e-5
    assert relative_error(dweight, wr.grad) < 1e-4 and relative_error(dbias, br.grad) < 1e-4
