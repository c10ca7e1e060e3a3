"""Layer, RMS, group and instance normalization in cuDNN's style: a descriptor (mode, epsilon,
normalized dims or groups), tensor descriptors, alpha/beta (see ``problem.py``).

scale, bias, dscale and dbias share ``scale_desc`` (x's dims with the non-normalized ones set to
1; per channel for GROUP/INSTANCE), mean and inv_std share ``stats_desc`` (one FLOAT per row,
DOUBLE for DOUBLE data). Any of scale and bias may be None (1 and 0).
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import BadParam, require
from opendnn.core.handle import Handle
from opendnn.families.normalization.problem import NormDescriptor, NormMode, norm_problem


def normalization_forward_training(
    handle: Handle,
    norm_desc: NormDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    scale_desc: TensorDescriptor | None,
    scale: Any,
    bias: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
    stats_desc: TensorDescriptor,
    mean: Any,
    inv_std: Any,
) -> None:
    """``y = alpha * norm(x) * scale + bias + beta * y`` and the row statistics mean and inv_std
    (RMS_NORM: inv_rms into inv_std; mean must be None).

    Raises:
        BadParam: a rule of ``norm_problem``; a mean given for RMS_NORM or missing for the others.
    """
    rms = isinstance(norm_desc, NormDescriptor) and norm_desc.mode is NormMode.RMS_NORM
    require((mean is None) == rms, "mean must be None for RMS_NORM and an array for the other modes")
    require(inv_std is not None, "inv_std=None: training forward writes the statistics")
    _forward(handle, norm_desc, alpha, x_desc, x, scale_desc, scale, bias, beta, y_desc, y, stats_desc, mean, inv_std)


def normalization_forward_inference(
    handle: Handle,
    norm_desc: NormDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    scale_desc: TensorDescriptor | None,
    scale: Any,
    bias: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * norm(x) * scale + bias + beta * y``, no statistics written.

    Raises:
        BadParam: a rule of ``norm_problem``.
    """
    _forward(handle, norm_desc, alpha, x_desc, x, scale_desc, scale, bias, beta, y_desc, y, None, None, None)


def normalization_backward(
    handle: Handle,
    norm_desc: NormDescriptor,
    alpha_data: float,
    beta_data: float,
    alpha_param: float,
    beta_param: float,
    x_desc: TensorDescriptor,
    x: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    scale_desc: TensorDescriptor | None,
    scale: Any,
    dscale: Any,
    dbias: Any,
    stats_desc: TensorDescriptor | None,
    mean: Any,
    inv_std: Any,
    dx_desc: TensorDescriptor,
    dx: Any,
) -> None:
    """``dx = alpha_data * dx' + beta_data * dx``, ``dscale = alpha_param * dscale' + beta_param *
    dscale`` (dbias alike). mean and inv_std from the training forward may be given (both, or
    inv_std alone for RMS_NORM) or None: the statistics are then recomputed from x. dscale and
    dbias may be None (not computed).

    Raises:
        BadParam: a rule of ``norm_problem``; dscale or dbias without scale_desc.
    """
    require(
        scale_desc is not None or (scale is None and dscale is None and dbias is None),
        "scale_desc=None but scale, dscale or dbias is given",
    )
    problem = norm_problem(
        norm_desc,
        x_desc,
        dx_desc,
        scale_desc=scale_desc if scale is not None else None,
        bias_desc=scale_desc if dbias is not None else None,
        stats_desc=stats_desc if inv_std is not None else None,
        dy_desc=dy_desc,
        dscale_desc=scale_desc if dscale is not None else None,
        alpha=alpha_data,
        beta=beta_data,
        dparam_alpha=alpha_param,
        dparam_beta=beta_param,
        has_mean=mean is not None,
    )
    dispatch(
        handle,
        "normalization",
        problem,
        bind("x", x_desc, x),
        bind("dx", dx_desc, dx, output=True),
        _optional("scale", scale_desc, scale),
        _optional("dbias", scale_desc, dbias, True),
        _optional("mean", stats_desc, mean),
        _optional("inv_std", stats_desc, inv_std),
        bind("dy", dy_desc, dy),
        _optional("dscale", scale_desc, dscale, True),
    )


def _forward(
    handle: Handle,
    norm_desc: NormDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    scale_desc: TensorDescriptor | None,
    scale: Any,
    bias: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
    stats_desc: TensorDescriptor | None,
    mean: Any,
    inv_std: Any,
) -> None:
    require(scale_desc is not None or (scale is None and bias is None), "scale_desc=None but scale or bias is given")
    problem = norm_problem(
        norm_desc,
        x_desc,
        y_desc,
        scale_desc=scale_desc if scale is not None else None,
        bias_desc=scale_desc if bias is not None else None,
        stats_desc=stats_desc if inv_std is not None else None,
        alpha=alpha,
        beta=beta,
        has_mean=mean is not None,
    )
    dispatch(
        handle,
        "normalization",
        problem,
        bind("x", x_desc, x),
        bind("y", y_desc, y, output=True),
        _optional("scale", scale_desc, scale),
        _optional("bias", scale_desc, bias),
        _optional("mean", stats_desc, mean, True),
        _optional("inv_std", stats_desc, inv_std, True),
    )


def _optional(name: str, desc: TensorDescriptor | None, array: Any, output: bool = False) -> Bound | None:
    if array is None:
        return None
    if desc is None:  # (bind would refuse it too, without naming the array)
        raise BadParam(f"{name}_desc=None but {name} is given")
    return bind(name, desc, array, output=output)
