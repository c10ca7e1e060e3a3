"""The Pythonic LRN functions: local response norm (cross-channel LRN) and divisive norm (LCN), each
with its ``<name>_backward``.

``local_response_norm`` places its window as cuDNN does: for an even ``size`` it reaches one channel
further ahead and one less behind than torch's (odd sizes agree; see ``problem.py``).
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, empty_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import OpenDnnError
from opendnn.core.handle import Handle
from opendnn.families.lrn.problem import DivNormMode, LRNDescriptor, LRNMode, LRNProblem, lrn_problem

# local response norm and divisive norm ----------------------------------------------------------


@caller_dtypes
def local_response_norm(
    x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0, *, handle: Handle | None = None
) -> Any:
    """x / (k + alpha/size * sum of x^2 over ``size`` neighbouring channels)^beta (cuDNN's window)."""
    xb = wrap("x", x)
    y = empty_like(xb)
    problem = _lrn_problem(LRNMode.CROSS_CHANNEL_DIM1, xb, y, size, alpha, beta, k)
    dispatch(handle_for(xb, handle), "lrn", problem, xb, y)
    return to_caller_kind(y.view, x)


@caller_dtypes
def local_response_norm_backward(
    dy: Any, x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0, *, handle: Handle | None = None
) -> Any:
    """dx of ``local_response_norm``."""
    xb, dyb = wrap("x", x), wrap("dy", dy)
    dx = empty_like(xb)
    problem = _lrn_problem(LRNMode.CROSS_CHANNEL_DIM1, xb, dx, size, alpha, beta, k, backward=True, dy=dyb)
    dispatch(handle_for(xb, handle), "lrn", problem, xb, dx, None, dyb)
    return to_caller_kind(dx.view, x)


@caller_dtypes
def divisive_norm(
    x: Any,
    means: Any = None,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    *,
    temp: Any = None,
    temp2: Any = None,
    handle: Handle | None = None,
) -> Any:
    """(x - means) / (k + alpha/size^S * box sum of (x - means)^2 over size^S spatial neighbours)^beta."""
    xb = wrap("x", x)
    y = empty_like(xb)
    means_b, temp_b, temp2_b = _like("means", means), _like("temp", temp), _like("temp2", temp2)
    problem = _lrn_problem(
        DivNormMode.PRECOMPUTED_MEANS, xb, y, size, alpha, beta, k, means=means_b, temp=temp_b, temp2=temp2_b
    )
    dispatch(handle_for(xb, handle), "lrn", problem, xb, y, means_b, None, None, temp_b, temp2_b)
    return to_caller_kind(y.view, x)


@caller_dtypes
def divisive_norm_backward(
    dy: Any,
    x: Any,
    means: Any = None,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    *,
    temp: Any = None,
    temp2: Any = None,
    handle: Handle | None = None,
) -> tuple[Any, Any]:
    """(dx, dmeans) of ``divisive_norm``."""
    xb, dyb = wrap("x", x), wrap("dy", dy)
    dx, dmeans = empty_like(xb), empty_like(xb)
    means_b, temp_b, temp2_b = _like("means", means), _like("temp", temp), _like("temp2", temp2)
    problem = _lrn_problem(
        DivNormMode.PRECOMPUTED_MEANS,
        xb,
        dx,
        size,
        alpha,
        beta,
        k,
        backward=True,
        dy=dyb,
        means=means_b,
        temp=temp_b,
        temp2=temp2_b,
    )
    dispatch(handle_for(xb, handle), "lrn", problem, xb, dx, means_b, dyb, dmeans, temp_b, temp2_b)
    return to_caller_kind(dx.view, x), to_caller_kind(dmeans.view, x)


# what these functions call the LRN descriptor's fields
_LRN_NAMES = CallerNames({"n": "size", "x_desc": "x", "y_desc": "y"})


def _lrn_problem(
    mode: LRNMode | DivNormMode,
    xb: Bound,
    out: Bound,
    size: int,
    alpha: float,
    beta: float,
    k: float,
    *,
    backward: bool = False,
    **others: Bound | None,
) -> LRNProblem:
    """The problem of a call: ``others`` are the further tensors that share x's dims (dy, means,
    temp, temp2), None where absent."""
    descs = {bound.name: bound.desc for bound in others.values() if bound is not None}
    try:
        return lrn_problem(
            LRNDescriptor(size, alpha, beta, k),
            mode,
            xb.desc,
            out.desc,
            backward=backward,
            others=descs,
            has_means=others.get("means") is not None,
        )
    except OpenDnnError as error:
        raise _LRN_NAMES.renamed(error) from None


def _like(name: str, array: Any) -> Bound | None:
    return None if array is None else wrap(name, array)
