"""Samples of batch normalization: training and inference forward, backward, and the Ex forms with
an add and an activation, against the float64 reference.

A variant reads "MODE/OPS[+activation][/option]": the mode, the fused ops, and "nosaved" (backward
recomputes the statistics). A sample checks every output it writes (y or dx, dz, the running and
saved statistics, dscale and dbias), each scaled by its reference's norm so that no output hides
behind a larger one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.samples import FLOAT_TYPES, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.batch_norm import functional as F
from opendnn.families.batch_norm import problem as bn
from opendnn.families.batch_norm.api import (
    batch_normalization_backward_ex,
    batch_normalization_forward_inference,
    batch_normalization_forward_training_ex,
    get_batch_normalization_backward_ex_workspace_size,
    get_batch_normalization_forward_training_ex_workspace_size,
    get_batch_normalization_training_ex_reserve_space_size,
)
from opendnn.families.pointwise.activation_api import ActivationDescriptor, ActivationMode

EPSILON = 2.0**-16  # exact in float32 (the interpreter's scalars)
FACTOR = 0.25  # exponential average factor, exact in float32
CEILING = 1.5  # clipped relu's ceiling


def _variant(sample: Sample) -> tuple[bn.BatchNormMode, bn.BatchNormOps, str | None, str]:
    mode, _, rest = sample.variant.partition("/")
    ops, _, option = rest.partition("/")
    ops, _, activation = ops.partition("+")
    return bn.BatchNormMode[mode], bn.BatchNormOps[ops], activation or None, option


def _activation(name: str | None) -> ActivationDescriptor | None:
    if name is None:
        return None
    return ActivationDescriptor(ActivationMode[name.upper()], coef=CEILING if name == "clipped_relu" else None)


def _parameters(t: Tensors, x: Any, mode: bn.BatchNormMode) -> tuple[TensorDescriptor, dict[str, Any]]:
    """The parameter descriptor and scale, bias, running mean and running variance (positive)."""
    desc = bn.derive_bn_tensor_descriptor(descriptor(x), mode)
    shape = desc.dims
    params = {
        "scale": t.input(shape, desc.dtype, "packed", 0.5, 2.0),
        "bias": t.input(shape, desc.dtype, "packed"),
        "mean": t.input(shape, desc.dtype, "packed"),
        "var": t.input(shape, desc.dtype, "packed", 0.5, 2.0),
    }
    return desc, params


def _scratch(t: Tensors, size: int) -> Any:
    return t.workspace(max(size, 16)) if size else None


def _joined(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every (actual, expected) pair scaled by 1 / ||expected||, concatenated."""
    actual, expected = [], []
    for a, e in pairs:
        norm = float(np.linalg.norm(e[np.isfinite(e)])) or 1.0
        actual.append(np.ravel(a) / norm)
        expected.append(np.ravel(e) / norm)
    return np.concatenate(actual), np.concatenate(expected)


def _forward_training(sample: Sample, t: Tensors, handle: Handle) -> dict[str, Any]:
    """Runs the (Ex) training forward; returns its tensors, outputs and the float64 reference."""
    mode, ops, activation, _ = _variant(sample)
    x = t.input(sample.shape, sample.dtype, sample.layout)
    z = t.input(sample.shape, sample.dtype, sample.layout) if ops is bn.BatchNormOps.BN_ADD_ACTIVATION else None
    desc, p = _parameters(t, x, mode)
    ref = bn.forward_training(
        t.values(x),
        t.values(p["scale"]),
        t.values(p["bias"]),
        EPSILON,
        mode,
        factor=FACTOR,
        running_mean=t.values(p["mean"]),
        running_var=t.values(p["var"]),
        z=None if z is None else t.values(z),
        activation=activation,
        coef=CEILING,
    )
    y, expected_y = blend(sample, t, sample.shape, ref["y"])
    saved_mean, saved_inv = (t.output(desc.dims, desc.dtype, "packed", None) for _ in range(2))
    act = _activation(activation)
    z_desc = None if z is None else descriptor(z)
    workspace = _scratch(
        t,
        get_batch_normalization_forward_training_ex_workspace_size(
            handle, mode, ops, descriptor(x), z_desc, descriptor(y), desc, act
        ),
    )
    reserve = _scratch(t, get_batch_normalization_training_ex_reserve_space_size(handle, mode, ops, act, descriptor(x)))
    batch_normalization_forward_training_ex(
        handle,
        mode,
        ops,
        sample.alpha,
        sample.beta,
        descriptor(x),
        x,
        z_desc,
        z,
        descriptor(y),
        y,
        desc,
        p["scale"],
        p["bias"],
        FACTOR,
        p["mean"],
        p["var"],
        EPSILON,
        saved_mean,
        saved_inv,
        act,
        workspace,
        reserve,
    )
    return dict(
        x=x,
        y=y,
        expected_y=expected_y,
        desc=desc,
        params=p,
        saved_mean=saved_mean,
        saved_inv=saved_inv,
        reserve=reserve,
        ref=ref,
        act=act,
    )


def run_forward_training(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    r = _forward_training(sample, t, handle)
    ref, p = r["ref"], r["params"]
    pairs = [checked(t, r["y"], r["expected_y"])]
    for actual, name in (
        (p["mean"], "running_mean"),
        (p["var"], "running_var"),
        (r["saved_mean"], "mean"),
        (r["saved_inv"], "inv_std"),
    ):
        pairs.append((t.values(actual), ref[name].reshape(r["desc"].dims)))
    return _joined(pairs)


def run_forward_inference(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    mode = _variant(sample)[0]
    x = t.input(sample.shape, sample.dtype, sample.layout)
    desc, p = _parameters(t, x, mode)
    values = {k: t.values(v) for k, v in p.items()}
    result = bn.forward_inference(t.values(x), values["scale"], values["bias"], values["mean"], values["var"], EPSILON)
    y, expected = blend(sample, t, sample.shape, result)
    batch_normalization_forward_inference(
        handle,
        mode,
        sample.alpha,
        sample.beta,
        descriptor(x),
        x,
        descriptor(y),
        y,
        desc,
        p["scale"],
        p["bias"],
        p["mean"],
        p["var"],
        EPSILON,
    )
    return checked(t, y, expected)


def run_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """The (Ex) training forward on the same handle, then its backward: dx, dz, dscale, dbias."""
    mode, ops, activation, option = _variant(sample)
    forward = _forward_training(Sample(sample.op, sample.variant, sample.dtype, sample.shape, sample.layout), t, handle)
    x, desc, p = forward["x"], forward["desc"], forward["params"]
    saved = option != "nosaved"
    dy = t.input(sample.shape, sample.dtype, sample.layout)
    mean, inv_std = (t.values(forward["saved_mean"]), t.values(forward["saved_inv"])) if saved else (None, None)
    mask = None
    if ops is not bn.BatchNormOps.BN:  # the mask the forward produced: where act' is 1 by its output
        y = t.values(forward["y"])
        mask = {"relu": y > 0, "clipped_relu": (y > 0) & (y < CEILING)}.get(
            activation or "identity", np.ones_like(y) > 0
        )
    ref = bn.backward(
        t.values(x), t.values(dy), t.values(p["scale"]), EPSILON, mode, mean=mean, inv_std=inv_std, mask=mask
    )
    dx, expected_dx = blend(sample, t, sample.shape, ref["dx"])
    dz, expected_dz = (None, None)
    if ops is bn.BatchNormOps.BN_ADD_ACTIVATION:
        dz, expected_dz = blend(sample, t, sample.shape, ref["dz"])
    param_start = {k: t.rng.uniform(-1, 1, desc.dims) if sample.beta != 0 else None for k in ("dscale", "dbias")}
    dscale, dbias = (t.output(desc.dims, desc.dtype, "packed", param_start[k]) for k in ("dscale", "dbias"))
    expected_params = [
        sample.alpha * ref[k] + (0.0 if start is None else sample.beta * start) for k, start in param_start.items()
    ]
    act = forward["act"]
    dz_desc = None if dz is None else descriptor(dz)
    workspace = _scratch(
        t,
        get_batch_normalization_backward_ex_workspace_size(
            handle,
            mode,
            ops,
            descriptor(x),
            descriptor(forward["y"]),
            descriptor(dy),
            dz_desc,
            descriptor(dx),
            desc,
            act,
        ),
    )
    batch_normalization_backward_ex(
        handle,
        mode,
        ops,
        sample.alpha,
        sample.beta,
        sample.alpha,
        sample.beta,
        descriptor(x),
        x,
        descriptor(forward["y"]),
        forward["y"],
        descriptor(dy),
        dy,
        dz_desc,
        dz,
        descriptor(dx),
        dx,
        desc,
        p["scale"],
        p["bias"],
        dscale,
        dbias,
        EPSILON,
        forward["saved_mean"] if saved else None,
        forward["saved_inv"] if saved else None,
        act,
        workspace,
        forward["reserve"],
    )
    pairs = [checked(t, dx, expected_dx), (t.values(dscale), expected_params[0]), (t.values(dbias), expected_params[1])]
    if dz is not None and expected_dz is not None:
        pairs.append(checked(t, dz, expected_dz))
    return _joined(pairs)


SHAPES = {"small": (3, 5, 4, 6), "large": (16, 96, 28, 28)}
ODD_SHAPES = {  # N = 1, H = W = 1, odd planes and channel counts, 5-D and 2-D tensors
    "small": ((1, 6, 4, 4), (6, 5, 1, 1), (3, 7, 3, 5), (2, 3, 2, 3, 4), (6, 5)),
    "large": ((1, 64, 56, 56), (256, 1000, 1, 1), (32, 67, 7, 7), (4, 32, 8, 14, 14), (512, 300)),
}


def samples(size: str = "small") -> Iterator[Sample]:
    """The batch normalization samples at SHAPES[size], plus the odd shapes."""
    shape = SHAPES[size]

    def sample(
        op: str, runner: Callable[..., Any], variant: str, dtype: DataType = DataType.FLOAT, **kw: Any
    ) -> Sample:
        return Sample(op, variant, dtype, kw.pop("shape", shape), runner=runner, **kw)

    training, inference, backward = run_forward_training, run_forward_inference, run_backward
    for dtype in FLOAT_TYPES:
        yield sample("bn_forward_training", training, "SPATIAL/BN", dtype)
        yield sample("bn_backward", backward, "SPATIAL/BN", dtype)
        yield sample("bn_forward_training", training, "SPATIAL/BN_ADD_ACTIVATION+relu", dtype, layout="permuted")
    for layout in ("permuted", "subregion"):
        yield sample("bn_forward_training", training, "SPATIAL/BN", layout=layout)
        yield sample("bn_forward_training", training, "PER_ACTIVATION/BN", layout=layout)
        yield sample("bn_forward_inference", inference, "SPATIAL/BN", layout=layout)
        yield sample("bn_backward", backward, "SPATIAL/BN", layout=layout)
        yield sample("bn_backward", backward, "PER_ACTIVATION/BN/nosaved", layout=layout)
        yield sample("bn_backward", backward, "SPATIAL/BN_ADD_ACTIVATION+relu", layout=layout)
    yield sample("bn_forward_training", training, "SPATIAL_PERSISTENT/BN")
    yield sample("bn_forward_training", training, "SPATIAL/BN_ACTIVATION+clipped_relu", DataType.HALF)
    yield sample(
        "bn_forward_training", training, "SPATIAL/BN_ADD_ACTIVATION+identity", layout="subregion", alpha=0.5, beta=0.25
    )
    yield sample("bn_forward_inference", inference, "SPATIAL/BN", DataType.BFLOAT16)
    yield sample("bn_forward_inference", inference, "PER_ACTIVATION/BN", layout="subregion", alpha=0.5, beta=-0.75)
    yield sample("bn_backward", backward, "SPATIAL/BN/nosaved", DataType.BFLOAT16, layout="permuted")
    yield sample("bn_backward", backward, "SPATIAL/BN_ACTIVATION+clipped_relu", layout="permuted")
    yield sample("bn_backward", backward, "SPATIAL/BN_ADD_ACTIVATION+relu", DataType.BFLOAT16)
    yield sample("bn_backward", backward, "SPATIAL/BN", layout="subregion", alpha=0.5, beta=0.25)
    for odd in ODD_SHAPES[size]:
        yield sample("bn_forward_training", training, "SPATIAL/BN", shape=odd, layout="permuted")
        yield sample("bn_backward", backward, "SPATIAL/BN_ADD_ACTIVATION+relu", shape=odd)


def error_samples() -> list[ErrorSample]:
    """Bad calls of batch normalization and their messages."""
    statistics = lambda: {"running_mean": values(3), "running_var": values(3)}  # noqa: E731
    return [
        ErrorSample(
            "momentum above 1",
            F.batch_norm,
            lambda: {"x": values(4, 3, 2), **statistics(), "training": True, "momentum": 2.0},
            BadParam,
            "momentum=2.0 must be between 0 and 1",
        ),
        ErrorSample(
            "a negative eps",
            F.batch_norm,
            lambda: {"x": values(4, 3, 2), **statistics(), "eps": -0.001},
            BadParam,
            "eps=-0.001 must be at least 0.0",
        ),
        ErrorSample(
            "an activation the fused forms lack",
            F.batch_norm_add_activation,
            lambda: {"x": values(4, 3, 2), "z": values(4, 3, 2), "activation": "sigmoid"},
            BadParam,
            "activation='sigmoid' must be 'relu', 'clipped_relu', 'identity' or None",
        ),
    ]
