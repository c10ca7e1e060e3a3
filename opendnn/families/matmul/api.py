"""Matrix multiplication as cuBLASLt's cublasLtMatmul: batched, strided, broadcast batch, with a
fused epilogue (bias, activation, residual, fp8 scales).

``c = alpha * (act(a_scale * b_scale * (a @ b) + bias) + residual) + beta * c``; see
``problem.py`` for the shape and dtype rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import TensorDescriptor, check_member
from opendnn.core.dispatch import dispatch, require_handle
from opendnn.core.errors import BadParam, Status, require
from opendnn.core.handle import Handle, MathType
from opendnn.families.matmul.problem import BiasAxis, MatmulProblem, matmul_problem
from opendnn.families.pointwise.problem import PointwiseMode


@dataclass(frozen=True)
class MatmulEpilogue:
    """What is applied to the product before it is blended into C (cuBLASLt's epilogue attributes).

    Args:
        bias_desc, bias: a vector of N (bias_axis COLUMN, torch's linear) or M (ROW) elements, or None.
        bias_axis: BiasAxis or its value ("column", "row").
        activation: a forward activation (``PointwiseMode.RELU_FWD``, ``GELU_FWD``, ...) or None.
        coef: the activation's parameter (clipped relu's ceiling, elu's alpha, swish's and softplus's beta);
            None for its default (the pointwise problem.py's ACTIVATION_TABLE: 1.0 for elu, swish and softplus).
        residual_desc, residual: a tensor of C's dims added after the activation, or None.
        a_scale, b_scale: per-tensor scales multiplying the product (fp8 inputs' dequantization).
    """

    bias_desc: TensorDescriptor | None = None
    bias: Any = None
    bias_axis: BiasAxis = BiasAxis.COLUMN
    activation: PointwiseMode | None = None
    coef: float | None = None
    residual_desc: TensorDescriptor | None = None
    residual: Any = None
    a_scale: float = 1.0
    b_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "bias_axis", check_member("bias_axis", BiasAxis, self.bias_axis))
        if self.activation is not None:
            object.__setattr__(self, "activation", check_member("activation", PointwiseMode, self.activation))
        for name in ("bias", "residual"):
            given = getattr(self, f"{name}_desc") is not None, getattr(self, name) is not None
            require(
                given[0] == given[1],
                f"{name}_desc and {name} must be given together (got "
                f"{name}_desc={'set' if given[0] else None}, "
                f"{name}={'set' if given[1] else None})",
                Status.BAD_PARAM_NULL_POINTER,
            )


def matmul(
    handle: Handle,
    alpha: float,
    a_desc: TensorDescriptor,
    a: Any,
    b_desc: TensorDescriptor,
    b: Any,
    beta: float,
    c_desc: TensorDescriptor,
    c: Any,
    epilogue: MatmulEpilogue | None = None,
) -> None:
    """``c = alpha * epilogue(a @ b) + beta * c`` over broadcast batch dims; with beta == 0, c is never read.

    FLOAT inputs use TF32 tensor cores, and fp8 inputs fast accumulation, only when
    ``handle.math_type`` is TENSOR_OP.

    Raises:
        BadParam: shapes that do not multiply or broadcast (both named), a tensor past its buffer or
            on another device, a bias or residual of the wrong shape.
        NotSupported: an unsupported dtype pair.
    """
    epilogue = epilogue or NO_EPILOGUE
    if not isinstance(epilogue, MatmulEpilogue):
        raise BadParam(f"epilogue={epilogue!r} must be a MatmulEpilogue or None")
    ab = bind("a", a_desc, a)
    bb = bind("b", b_desc, b)
    cb = bind("c", c_desc, c, output=True)
    problem = _problem(handle, a_desc, b_desc, c_desc, alpha, beta, epilogue)
    bias = None if epilogue.bias is None else bind("bias", epilogue.bias_desc, epilogue.bias)
    residual = None if epilogue.residual is None else bind("residual", epilogue.residual_desc, epilogue.residual)
    dispatch(handle, "matmul", problem, ab, bb, cb, bias, residual)


NO_EPILOGUE = MatmulEpilogue()
PROBLEM_CACHE_LIMIT = 256  # validated problems kept in a handle's algorithm cache


def _problem(
    handle: Handle,
    a_desc: TensorDescriptor,
    b_desc: TensorDescriptor,
    c_desc: TensorDescriptor,
    alpha: float,
    beta: float,
    epilogue: MatmulEpilogue,
) -> MatmulProblem:
    """The validated problem, from the handle's algorithm cache when these descriptors and
    parameters were seen before (validation is a pure function of them, and a repeated call, as in
    a training loop, then skips it)."""
    tf32 = require_handle(handle).math_type is MathType.TENSOR_OP
    key = (
        "matmul",
        a_desc,
        b_desc,
        c_desc,
        alpha,
        beta,
        epilogue.bias_desc,
        epilogue.bias_axis,
        epilogue.activation,
        epilogue.coef,
        epilogue.residual_desc,
        epilogue.a_scale,
        epilogue.b_scale,
        tf32,
        handle.fast_math,
    )
    problem = handle.algorithm_cache.get(key)
    if problem is None:
        problem = matmul_problem(
            a_desc,
            b_desc,
            c_desc,
            alpha=alpha,
            beta=beta,
            bias_desc=epilogue.bias_desc,
            bias_axis=epilogue.bias_axis,
            activation=epilogue.activation,
            coef=epilogue.coef,
            residual_desc=epilogue.residual_desc,
            a_scale=epilogue.a_scale,
            b_scale=epilogue.b_scale,
            allow_tf32=tf32,
            fast_fp8_accumulation=tf32,
            fast_math=handle.fast_math,
        )
        if len(handle.algorithm_cache) < PROBLEM_CACHE_LIMIT:
            handle.algorithm_cache[key] = problem
    return problem
