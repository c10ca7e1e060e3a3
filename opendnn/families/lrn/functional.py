"""The Pythonic LRN functions: local response norm (cross-channel LRN) and divisive norm (LCN), each
with its ``<name>_backward``.

``local_response_norm`` places its window as cuDNN does: for an even ``size`` it reaches one channel
further ahead and one less behind than torch's (odd sizes agree; see ``problem.py``).
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, empty_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.default_handle import handle_for
from opendnn.core.dispatch import dispatch
from opendnn.core.handle import Handle
from opendnn.families.lrn.problem import DivNormMode, LRNDescriptor, LRNMode, lrn_problem

# local response norm and divisive norm ----------------------------------------------------------

def local_response_norm(x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0, *,
                        handle: Handle | None = None) -> Any:
    """x / (k + alpha/size * sum of x^2 over ``size`` neighbouring channels)^beta (cuDNN's window)."""
    xb = wrap("x", x)
    y = empty_like(xb)
    problem = lrn_problem(LRNDescriptor(size, alpha, beta, k), LRNMode.CROSS_CHANNEL_DIM1, xb.desc, y.desc)
    dispatch(handle_for(xb, handle), "lrn", problem, xb, y)
    return to_caller_kind(y.view, x)


def local_response_norm_backward(dy: Any, x: Any, size: int, alpha: float = 1e-4, beta: float = 0.75,
                                 k: float = 1.0, *, handle: Handle | None = None) -> Any:
    """dx of ``local_response_norm``."""
    xb, dyb = wrap("x", x), wrap("dy", dy)
    dx = empty_like(xb)
    problem = lrn_problem(LRNDescriptor(size, alpha, beta, k), LRNMode.CROSS_CHANNEL_DIM1, xb.desc, dx.desc,
                          backward=True, others={"dy_desc": dyb.desc})
    dispatch(handle_for(xb, handle), "lrn", problem, xb, dx, None, dyb)
    return to_caller_kind(dx.view, x)


def divisive_norm(x: Any, means: Any = None, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
                  k: float = 2.0, *, temp: Any = None, temp2: Any = None, handle: Handle | None = None) -> Any:
    """(x - means) / (k + alpha/size^S * box sum of (x - means)^2 over size^S spatial neighbours)^beta."""
    xb = wrap("x", x)
    y = empty_like(xb)
    means_b = _like("means", means)
    problem = lrn_problem(LRNDescriptor(size, alpha, beta, k), DivNormMode.PRECOMPUTED_MEANS, xb.desc, y.desc,
                          others={"means_desc": means_b.desc} if means_b else None, has_means=means_b is not None)
    dispatch(handle_for(xb, handle), "lrn", problem, xb, y, means_b, None, None,
             _like("temp", temp), _like("temp2", temp2))
    return to_caller_kind(y.view, x)


def divisive_norm_backward(dy: Any, x: Any, means: Any = None, size: int = 5, alpha: float = 1e-4,
                           beta: float = 0.75, k: float = 2.0, *, temp: Any = None, temp2: Any = None,
                           handle: Handle | None = None) -> tuple[Any, Any]:
    """(dx, dmeans) of ``divisive_norm``."""
    xb, dyb = wrap("x", x), wrap("dy", dy)
    dx, dmeans = empty_like(xb), empty_like(xb)
    means_b = _like("means", means)
    others = {"dy_desc": dyb.desc, **({"means_desc": means_b.desc} if means_b else {})}
    problem = lrn_problem(LRNDescriptor(size, alpha, beta, k), DivNormMode.PRECOMPUTED_MEANS, xb.desc, dx.desc,
                          backward=True, others=others, has_means=means_b is not None)
    dispatch(handle_for(xb, handle), "lrn", problem, xb, dx, means_b, dyb, dmeans,
             _like("temp", temp), _like("temp2", temp2))
    return to_caller_kind(dx.view, x), to_caller_kind(dmeans.view, x)


def _like(name: str, array: Any) -> Bound | None:
    return None if array is None else wrap(name, array)
