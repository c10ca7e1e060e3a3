"""Batch normalization as cuDNN's: forward training and inference, backward, the Ex forms that fuse an
add and an activation, and their workspace and reserve-space size queries.

See ``problem.py`` for the formulas. Parameter tensors (scale, bias, running and saved
statistics, their gradients) are all described by one ``bn_scale_bias_mean_var_desc`` (or
``d_bn_scale_bias_desc``), as made by ``derive_bn_tensor_descriptor``. The calls without Ex take
no workspace: when the backend needs scratch memory for partial sums they allocate it themselves.
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, bind, bind_bytes, scratch_bytes
from opendnn.core.descriptors import NanPropagation, TensorDescriptor
from opendnn.core.dispatch import dispatch, load_backend, require_handle
from opendnn.core.errors import Status, require
from opendnn.core.handle import Handle
from opendnn.families.batch_norm.problem import (
    BatchNormMode,
    BatchNormOps,
    BatchNormProblem,
    BatchNormTensors,
    Direction,
    batch_norm_problem,
)
from opendnn.families.pointwise.activation_api import ActivationDescriptor


def batch_normalization_forward_training(
    handle: Handle,
    mode: BatchNormMode,
    alpha: float,
    beta: float,
    x_desc: TensorDescriptor,
    x: Any,
    y_desc: TensorDescriptor,
    y: Any,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    bn_scale: Any,
    bn_bias: Any,
    exponential_average_factor: float,
    result_running_mean: Any,
    result_running_variance: Any,
    epsilon: float,
    result_save_mean: Any = None,
    result_save_inv_variance: Any = None,
) -> None:
    """``y = alpha * (scale * xhat + bias) + beta * y`` with the batch statistics; updates the running
    mean and variance (unbiased) in place when given, writes the saved mean and inverse std when given.

    Raises:
        BadParam: a descriptor against the rules of ``batch_norm_problem``, epsilon below 1e-5, a
            tensor past its buffer or on another device.
    """
    batch_normalization_forward_training_ex(
        handle,
        mode,
        BatchNormOps.BN,
        alpha,
        beta,
        x_desc,
        x,
        None,
        None,
        y_desc,
        y,
        bn_scale_bias_mean_var_desc,
        bn_scale,
        bn_bias,
        exponential_average_factor,
        result_running_mean,
        result_running_variance,
        epsilon,
        result_save_mean,
        result_save_inv_variance,
        None,
        AUTOMATIC,
        None,
    )


def batch_normalization_forward_inference(
    handle: Handle,
    mode: BatchNormMode,
    alpha: float,
    beta: float,
    x_desc: TensorDescriptor,
    x: Any,
    y_desc: TensorDescriptor,
    y: Any,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    bn_scale: Any,
    bn_bias: Any,
    estimated_mean: Any,
    estimated_variance: Any,
    epsilon: float,
) -> None:
    """``y = alpha * (scale * (x - mean) / sqrt(var + eps) + bias) + beta * y`` with the estimated
    statistics; with beta == 0, y is never read.

    Raises:
        BadParam: as batch_normalization_forward_training.
    """
    problem = inference_problem(mode, alpha, beta, x_desc, y_desc, bn_scale_bias_mean_var_desc, epsilon)
    param = problem.param
    tensors = BatchNormTensors(
        bind("x", x_desc, x),
        bind("y", y_desc, y, output=True),
        bind("bn_scale", param, bn_scale),
        bind("bn_bias", param, bn_bias),
        mean=bind("estimated_mean", param, estimated_mean),
        variance=bind("estimated_variance", param, estimated_variance),
    )
    _run(handle, problem, tensors, AUTOMATIC)


def batch_normalization_backward(
    handle: Handle,
    mode: BatchNormMode,
    alpha_data_diff: float,
    beta_data_diff: float,
    alpha_param_diff: float,
    beta_param_diff: float,
    x_desc: TensorDescriptor,
    x: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    dx_desc: TensorDescriptor,
    dx: Any,
    d_bn_scale_bias_desc: TensorDescriptor,
    bn_scale: Any,
    d_bn_scale_result: Any,
    d_bn_bias_result: Any,
    epsilon: float,
    saved_mean: Any = None,
    saved_inv_variance: Any = None,
) -> None:
    """dx, dscale and dbias of the training forward, each blended: ``dx = alpha_data_diff * dx +
    beta_data_diff * dx``, ``dscale = alpha_param_diff * dscale + beta_param_diff * dscale`` (dbias
    likewise). The saved mean and inverse std (both or neither) are recomputed from x when absent.

    Raises:
        BadParam: as batch_normalization_forward_training; only one of the saved statistics given.
    """
    batch_normalization_backward_ex(
        handle,
        mode,
        BatchNormOps.BN,
        alpha_data_diff,
        beta_data_diff,
        alpha_param_diff,
        beta_param_diff,
        x_desc,
        x,
        None,
        None,
        dy_desc,
        dy,
        None,
        None,
        dx_desc,
        dx,
        d_bn_scale_bias_desc,
        bn_scale,
        None,
        d_bn_scale_result,
        d_bn_bias_result,
        epsilon,
        saved_mean,
        saved_inv_variance,
        None,
        AUTOMATIC,
        None,
    )


def batch_normalization_forward_training_ex(
    handle: Handle,
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    alpha: float,
    beta: float,
    x_desc: TensorDescriptor,
    x: Any,
    z_desc: TensorDescriptor | None,
    z: Any,
    y_desc: TensorDescriptor,
    y: Any,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    bn_scale: Any,
    bn_bias: Any,
    exponential_average_factor: float,
    result_running_mean: Any,
    result_running_variance: Any,
    epsilon: float,
    result_save_mean: Any,
    result_save_inv_variance: Any,
    activation_desc: ActivationDescriptor | None,
    workspace: Any,
    reserve_space: Any,
) -> None:
    """``y = alpha * act(scale * xhat + bias [+ z]) + beta * y`` (bn_ops BN, BN_ACTIVATION,
    BN_ADD_ACTIVATION), running and saved statistics as batch_normalization_forward_training.

    Args:
        activation_desc: RELU, CLIPPED_RELU or IDENTITY for BN_ACTIVATION and BN_ADD_ACTIVATION; its
            nan_opt PROPAGATE_NAN keeps a NaN pre-activation NaN through relu and clipped relu (and
            marks it in the reserve space, so the backward's gradient there is NaN too).
        workspace: a contiguous array of at least
            ``get_batch_normalization_forward_training_ex_workspace_size`` bytes (None when 0).
        reserve_space: a contiguous array of at least ``get_batch_normalization_training_ex_reserve_space_size``
            bytes, handed unchanged to batch_normalization_backward_ex (None when 0).

    Raises:
        BadParam: as batch_normalization_forward_training; z missing for BN_ADD_ACTIVATION, an
            activation missing for the Ex ops, a workspace or reserve space missing or too small,
            only one of the saved statistics given.
    """
    problem = training_ex_problem(
        mode,
        bn_ops,
        alpha,
        beta,
        x_desc,
        z_desc,
        y_desc,
        bn_scale_bias_mean_var_desc,
        exponential_average_factor,
        epsilon,
        activation_desc,
        running=(result_running_mean is not None, result_running_variance is not None),
        saved=(result_save_mean is not None, result_save_inv_variance is not None),
    )
    param = problem.param
    tensors = BatchNormTensors(
        bind("x", x_desc, x),
        bind("y", y_desc, y, output=True),
        bind("bn_scale", param, bn_scale),
        bind("bn_bias", param, bn_bias),
        z=None if problem.z is None else bind("z", problem.z, _given("z", z)),
        mean=_optional("result_running_mean", param, result_running_mean, output=True),
        variance=_optional("result_running_variance", param, result_running_variance, output=True),
        saved_mean=_optional("result_save_mean", param, result_save_mean, output=True),
        saved_inv_std=_optional("result_save_inv_variance", param, result_save_inv_variance, output=True),
    )
    _run(handle, problem, tensors, workspace, reserve_space)


def batch_normalization_backward_ex(
    handle: Handle,
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    alpha_data_diff: float,
    beta_data_diff: float,
    alpha_param_diff: float,
    beta_param_diff: float,
    x_desc: TensorDescriptor,
    x: Any,
    y_desc: TensorDescriptor | None,
    y: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    dz_desc: TensorDescriptor | None,
    dz: Any,
    dx_desc: TensorDescriptor,
    dx: Any,
    d_bn_scale_bias_desc: TensorDescriptor,
    bn_scale: Any,
    bn_bias: Any,
    d_bn_scale_result: Any,
    d_bn_bias_result: Any,
    epsilon: float,
    saved_mean: Any,
    saved_inv_variance: Any,
    activation_desc: ActivationDescriptor | None,
    workspace: Any,
    reserve_space: Any,
) -> None:
    """Backward of batch_normalization_forward_training_ex: dx, dz (BN_ADD_ACTIVATION; blended as
    dx), dscale and dbias. The activation's mask comes from the forward's reserve space; y and
    bn_bias are checked, not needed.

    Raises:
        BadParam: as batch_normalization_backward; dz missing for BN_ADD_ACTIVATION, a workspace or
            reserve space missing or too small.
    """
    problem = backward_ex_problem(
        mode,
        bn_ops,
        alpha_data_diff,
        beta_data_diff,
        alpha_param_diff,
        beta_param_diff,
        x_desc,
        dy_desc,
        dz_desc,
        dx_desc,
        d_bn_scale_bias_desc,
        epsilon,
        activation_desc,
        saved=(saved_mean is not None, saved_inv_variance is not None),
    )
    param = problem.param
    if y_desc is not None and y is not None:
        bind("y", y_desc, y)
    if bn_bias is not None:
        bind("bn_bias", param, bn_bias)
    tensors = BatchNormTensors(
        bind("x", x_desc, x),
        bind("dx", dx_desc, dx, output=True),
        bind("bn_scale", param, bn_scale),
        z=None if problem.z is None else bind("dz", problem.z, _given("dz", dz), output=True),
        dy=bind("dy", dy_desc, dy),
        dscale=bind("d_bn_scale_result", param, d_bn_scale_result, output=True),
        dbias=bind("d_bn_bias_result", param, d_bn_bias_result, output=True),
        saved_mean=_optional("saved_mean", param, saved_mean),
        saved_inv_std=_optional("saved_inv_variance", param, saved_inv_variance),
    )
    _run(handle, problem, tensors, workspace, reserve_space)


def inference_problem(
    mode: BatchNormMode,
    alpha: float,
    beta: float,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    epsilon: float,
) -> BatchNormProblem:
    """The validated problem of batch_normalization_forward_inference (as training_ex_problem).

    Raises:
        BadParam, NotSupported: as batch_normalization_forward_inference.
    """
    return batch_norm_problem(
        Direction.INFERENCE, mode, x_desc, y_desc, bn_scale_bias_mean_var_desc, epsilon, alpha=alpha, beta=beta
    )


def training_ex_problem(
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    alpha: float,
    beta: float,
    x_desc: TensorDescriptor,
    z_desc: TensorDescriptor | None,
    y_desc: TensorDescriptor,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    exponential_average_factor: float,
    epsilon: float,
    activation_desc: ActivationDescriptor | None,
    *,
    running: tuple[bool, bool],
    saved: tuple[bool, bool],
) -> BatchNormProblem:
    """The validated problem of batch_normalization_forward_training_ex, given which of the running
    statistics (mean, variance) and of the saved ones (mean, inverse variance) the call passes: its
    checks, made once per signature by opendnn.functional's plans.

    Raises:
        BadParam, NotSupported: as batch_normalization_forward_training_ex.
    """
    require(
        saved[0] == saved[1], "result_save_mean and result_save_inv_variance must be given together or both be None"
    )
    return batch_norm_problem(
        Direction.TRAINING,
        mode,
        x_desc,
        y_desc,
        bn_scale_bias_mean_var_desc,
        epsilon,
        ops=bn_ops,
        z_desc=z_desc,
        **_activation(activation_desc),
        factor=exponential_average_factor,
        alpha=alpha,
        beta=beta,
        update_running=running[0] or running[1],
        saved=saved[0],
        reserve=BatchNormOps(bn_ops) is not BatchNormOps.BN,
    )


def backward_ex_problem(
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    alpha_data_diff: float,
    beta_data_diff: float,
    alpha_param_diff: float,
    beta_param_diff: float,
    x_desc: TensorDescriptor,
    dy_desc: TensorDescriptor,
    dz_desc: TensorDescriptor | None,
    dx_desc: TensorDescriptor,
    d_bn_scale_bias_desc: TensorDescriptor,
    epsilon: float,
    activation_desc: ActivationDescriptor | None,
    *,
    saved: tuple[bool, bool],
    torch_rule: bool = False,
) -> BatchNormProblem:
    """The validated problem of batch_normalization_backward_ex, given which of the saved statistics
    (mean, inverse variance) the call passes (as training_ex_problem); ``torch_rule``: the gradient
    at a NaN pre-activation is dy (``batch_norm_problem``).

    Raises:
        BadParam, NotSupported: as batch_normalization_backward_ex.
    """
    require(saved[0] == saved[1], "saved_mean and saved_inv_variance must be given together or both be None")
    return batch_norm_problem(
        Direction.BACKWARD,
        mode,
        x_desc,
        dx_desc,
        d_bn_scale_bias_desc,
        epsilon,
        ops=bn_ops,
        z_desc=dz_desc,
        dy_desc=dy_desc,
        **_activation(activation_desc),
        alpha=alpha_data_diff,
        beta=beta_data_diff,
        alpha_param=alpha_param_diff,
        beta_param=beta_param_diff,
        saved=saved[0],
        reserve=BatchNormOps(bn_ops) is not BatchNormOps.BN,
        torch_rule=torch_rule,
    )


def space_sizes(handle: Handle, problem: BatchNormProblem) -> tuple[int, int]:
    """(workspace bytes, reserve-space bytes) that ``problem`` needs on the handle's backend (the
    reserve space 0 where the problem has none)."""
    backend = _backend(handle)
    return backend.workspace_size(problem), backend.reserve_size(problem) if problem.reserve else 0


def bind_reserve(reserve_space: Any, needed: int) -> Bound | None:
    """The caller's reserve space as bytes, checked against the ``needed`` size (None when 0)."""
    return bind_bytes("reserve_space", reserve_space, needed, "get_batch_normalization_training_ex_reserve_space_size")


def get_batch_normalization_forward_training_ex_workspace_size(
    handle: Handle,
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    x_desc: TensorDescriptor,
    z_desc: TensorDescriptor | None,
    y_desc: TensorDescriptor,
    bn_scale_bias_mean_var_desc: TensorDescriptor,
    activation_desc: ActivationDescriptor | None,
) -> int:
    """Bytes of workspace batch_normalization_forward_training_ex needs on this handle's backend
    (partial sums of the statistics on the Triton backend; none on NumPy)."""
    problem = training_ex_problem(
        mode,
        bn_ops,
        1.0,
        0.0,
        x_desc,
        z_desc,
        y_desc,
        bn_scale_bias_mean_var_desc,
        BN_QUERY_FACTOR,
        BN_QUERY_EPSILON,
        activation_desc,
        running=(False, False),
        saved=(False, False),
    )  # the call's problem (its plan sizes the workspace)
    return _backend(handle).workspace_size(problem)


def get_batch_normalization_backward_ex_workspace_size(
    handle: Handle,
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor | None,
    dy_desc: TensorDescriptor,
    dz_desc: TensorDescriptor | None,
    dx_desc: TensorDescriptor,
    d_bn_scale_bias_desc: TensorDescriptor,
    activation_desc: ActivationDescriptor | None,
) -> int:
    """Bytes of workspace batch_normalization_backward_ex needs (enough to recompute the statistics
    too, when the saved ones are not given)."""
    problem = backward_ex_problem(
        mode,
        bn_ops,
        1.0,
        0.0,
        1.0,
        0.0,
        x_desc,
        dy_desc,
        dz_desc,
        dx_desc,
        d_bn_scale_bias_desc,
        BN_QUERY_EPSILON,
        activation_desc,
        saved=(False, False),
    )
    return _backend(handle).workspace_size(problem)


def get_batch_normalization_training_ex_reserve_space_size(
    handle: Handle,
    mode: BatchNormMode,
    bn_ops: BatchNormOps,
    activation_desc: ActivationDescriptor | None,
    x_desc: TensorDescriptor,
) -> int:
    """Bytes of reserve space the Ex forward writes and the Ex backward reads: the activation's mask
    for BN_ACTIVATION and BN_ADD_ACTIVATION (a bit per element on Triton), 0 for BN."""
    from opendnn.families.batch_norm.problem import derive_bn_tensor_descriptor

    problem = training_ex_problem(
        mode,
        bn_ops,
        1.0,
        0.0,
        x_desc,
        x_desc,
        x_desc,
        derive_bn_tensor_descriptor(x_desc, mode),
        BN_QUERY_FACTOR,
        BN_QUERY_EPSILON,
        activation_desc,
        running=(False, False),
        saved=(False, False),
    )
    return _backend(handle).reserve_size(problem)


BN_QUERY_EPSILON, BN_QUERY_FACTOR = 1e-5, 0.0  # the size queries take neither; any valid ones
AUTOMATIC = object()  # as a workspace: allocate what the backend needs (the calls without Ex, opendnn.functional)


def _activation(activation_desc: ActivationDescriptor | None) -> dict[str, Any]:
    if activation_desc is None:
        return {}
    if not isinstance(activation_desc, ActivationDescriptor):  # (the message is formatted only on failure)
        require(False, f"activation_desc={activation_desc!r} must be an ActivationDescriptor or None")
    return {
        "activation": activation_desc.mode.value,
        "activation_coef": activation_desc.coef or 0.0,
        "propagate_nan": activation_desc.nan_opt is NanPropagation.PROPAGATE_NAN,
    }


def _given(name: str, array: Any) -> Any:
    require(array is not None, f"{name}=None but bn_ops=BN_ADD_ACTIVATION needs it", Status.BAD_PARAM_NULL_POINTER)
    return array


def _optional(name: str, desc: TensorDescriptor | None, array: Any, *, output: bool = False) -> Bound | None:
    if array is None or desc is None:
        return None
    return bind(name, desc, array, output=output)


def _backend(handle: Handle) -> Any:
    return load_backend("batch_norm", require_handle(handle).backend, handle.device)


def _run(
    handle: Handle, problem: BatchNormProblem, tensors: BatchNormTensors, workspace: Any, reserve_space: Any = None
) -> None:
    needed, reserve = space_sizes(handle, problem)
    if workspace is AUTOMATIC:  # ours: no checks needed
        workspace_bound = scratch_bytes(tensors.x, needed)
    else:
        workspace_bound = bind_bytes("workspace", workspace, needed, "the workspace size query")
    tensors = tensors._replace(workspace=workspace_bound, reserve=bind_reserve(reserve_space, reserve))
    dispatch(handle, "batch_norm", problem, tensors)
