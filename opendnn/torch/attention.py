"""The ``opendnn::`` operators of scaled dot-product attention and their torch-shaped call.

    out, stats = torch.ops.opendnn.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
        alibi_slopes, sinks, window_left, window_right, alignment, softcap, seed)

The forward saves the rows' logsumexp (``stats``, float32; float64 for float64 data) and the
backward operator computes dq, dk, dv, the gradient of a float ``attn_mask`` and of the ``sinks``
from it (no forward recomputed, no attention matrix stored). Inputs are (..., heads, sequence,
head dim) of any batch rank, or (sequence, head dim), as torch's SDPA takes them
(``opendnn.functional`` says how the leading dims merge). ALiBi slopes are constants (no
gradient); the dropout mask is regenerated from ``seed``. ``scaled_dot_product_attention`` below
is the call with torch's signature that ``opendnn.torch.enable()`` routes
``F.scaled_dot_product_attention`` to.

The fp8 forward (cuDNN's fp8 SDPA) is an operator of its own, without a gradient (an fp8 training
step needs scales the caller manages), and its backward another, called with the twelve factors:

    out, stats, amax_s, amax_o = torch.ops.opendnn.scaled_dot_product_attention_fp8(
        query, key, value, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o,
        is_causal, scale, enable_gqa, window_left, window_right, alignment, out_dtype)
    grad_query, grad_key, grad_value, amax_dq, amax_dk, amax_dv, amax_dp = (
        torch.ops.opendnn.scaled_dot_product_attention_fp8_backward(
            grad_out, query, key, value, out, stats, descale_q, descale_k, descale_v, descale_o,
            descale_do, descale_s, descale_dp, scale_s, scale_dq, scale_dk, scale_dv, scale_dp,
            is_causal, scale, enable_gqa, window_left, window_right, alignment, grad_dtype))

``scaled_dot_product_attention_fp8`` and ``scaled_dot_product_attention_fp8_backward`` below call
them with the factors as keyword tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import opendnn.functional as F
from opendnn.core.errors import NotSupported
from opendnn.families.attention.descriptor import MAX_SEED
from opendnn.families.attention.functional import broadcast_shapes
from opendnn.families.attention.problem import FP8_BACKWARD_SCALES, FP8_SCALES
from opendnn.torch.library import (
    as_torch_error,
    compute_dtype,
    define,
    empty_in_order_of,
    empty_packed,
    lower_precision,
    register_autograd,
)
from opendnn.torch.operators import dense

Tensor = torch.Tensor

OPTIONS = (
    "float dropout_p, bool is_causal, float? scale, bool enable_gqa, Tensor? alibi_slopes, Tensor? sinks,"
    " int? window_left, int? window_right, str alignment, float? softcap, int seed"
)


def _keywords(
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    alibi_slopes: Tensor | None,
    sinks: Tensor | None,
    window_left: int | None,
    window_right: int | None,
    alignment: str,
    softcap: float | None,
    seed: int,
) -> dict[str, Any]:
    """The operator's options as opendnn.functional's arguments."""
    return dict(
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        window=(window_left, window_right),
        alignment=alignment,
        softcap=softcap,
        seed=seed,
    )


def _outputs_like(query: Tensor, shape: Sequence[Any], dtype: torch.dtype | None = None) -> Tensor:
    """An output of ``shape`` laid out as opendnn.functional lays it: in query's memory order for
    4-dim inputs, packed for the other ranks."""
    return empty_in_order_of(query, shape, dtype) if query.ndim == 4 else empty_packed(query, shape, dtype)


def _out_fake(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool, dtype: torch.dtype) -> Tensor:
    """The forward's out, of ``dtype``, as the call lays it out."""
    shape = broadcast_shapes(tuple(query.shape), tuple(key.shape), tuple(value.shape), bool(enable_gqa))
    broadcast = list(shape[:-1]) != list(query.shape[:-1])  # a broadcast query's output is packed
    return empty_packed(query, shape, dtype) if broadcast else _outputs_like(query, shape, dtype)


def _forward_fake(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *options: Any) -> Any:
    out = _out_fake(query, key, value, options[3], query.dtype)
    return out, empty_packed(query, out.shape[:-1], compute_dtype(query.dtype))


def _forward(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *options: Any) -> Any:
    return F.scaled_dot_product_attention(query, key, value, attn_mask, return_stats=True, **_keywords(*options))


def _without_dropout(position: int) -> Any:
    """An operator's ``repeatable`` rule: its dropout probability, at ``position``, is 0 (a call with
    dropout takes a seed drawn for it, so its signature never repeats)."""
    return lambda *args: args[position] == 0.0


scaled_dot_product_attention_op = define(
    "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
    + OPTIONS
    + ") -> (Tensor, Tensor)",
    _forward,
    _forward_fake,
    autocast=lower_precision,
    repeatable=_without_dropout(4),
)


def _backward_fake(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    stats: Tensor,
    attn_mask: Tensor | None,
    *options: Any,
) -> tuple[Tensor, ...]:
    *rest, mask_grad = options
    sinks = rest[5]
    mask = attn_mask if mask_grad else None
    return (
        *(_outputs_like(t, t.shape) for t in (query, key, value)),
        *(empty_packed(query, [0]) if t is None else empty_packed(t, t.shape) for t in (mask, sinks)),
    )


def _backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    stats: Tensor,
    attn_mask: Tensor | None,
    *options: Any,
) -> tuple[Tensor, ...]:
    *rest, mask_grad = options
    dq, dk, dv, *extra = F.scaled_dot_product_attention_backward(
        grad_out, query, key, value, out, stats, attn_mask, mask_grad=mask_grad, **_keywords(*rest)
    )
    mask_and_sinks = [
        extra.pop(0).contiguous() if wanted else query.new_empty(0)  # (the mask's and sinks' packed)
        for wanted in (mask_grad and attn_mask is not None, rest[5] is not None)
    ]
    return dq, dk, dv, *mask_and_sinks


# dq, dk, dv, the mask's gradient (empty unless mask_grad) and the sinks' (empty without sinks): a
# fixed number of outputs, which autograd and torch's batching of backward passes take, where they
# take no list
scaled_dot_product_attention_backward_op = define(
    "scaled_dot_product_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out,"
    " Tensor stats, Tensor? attn_mask, " + OPTIONS + ", bool mask_grad) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _backward,
    _backward_fake,
    differentiable=False,
    repeatable=_without_dropout(7),
)

_MASK, _SINKS = 3, 9  # the positions of attn_mask and sinks among the operator's inputs


def _save(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    query, key, value, attn_mask, *options = inputs
    out, stats = output
    ctx.mark_non_differentiable(stats)  # (the softmax's log-sum-exp, as torch's attention's: no gradient)
    ctx.save_for_backward(query, key, value, out, stats, attn_mask, options[4], options[5])
    ctx.options = options


def _attention_backward(ctx: Any, grad_out: Tensor, _: Any) -> tuple[Any, ...]:
    query, key, value, out, stats, attn_mask, alibi_slopes, sinks = ctx.saved_tensors
    options = list(ctx.options)
    options[4], options[5] = alibi_slopes, sinks
    mask_grad = attn_mask is not None and attn_mask.is_floating_point() and ctx.needs_input_grad[_MASK]
    grads = scaled_dot_product_attention_backward_op(
        dense(grad_out, out), query, key, value, out, stats, attn_mask, *options, mask_grad
    )
    results: list[Any] = [*(g if ctx.needs_input_grad[k] else None for k, g in enumerate(grads[:3]))]
    results += [None] * (1 + len(ctx.options))
    if mask_grad:
        results[_MASK] = grads[3]
    if sinks is not None and ctx.needs_input_grad[_SINKS]:
        results[_SINKS] = grads[4]
    return tuple(results)


register_autograd(scaled_dot_product_attention_op, _attention_backward, _save)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    alibi_slopes: Tensor | None = None,
    sinks: Tensor | None = None,
    window: tuple[int | None, int | None] = (None, None),
    alignment: str = "top_left",
    softcap: float | None = None,
    seed: int | None = None,
) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention on the ``opendnn::`` operator, with opendnn's
    extensions as keywords (``opendnn.functional.scaled_dot_product_attention`` says what each does).

    Args:
        seed: the dropout mask's Philox key; None: drawn from torch's default generator when
            dropout_p > 0 (so torch.manual_seed reproduces it), 0 otherwise.
    """
    if seed is None:
        seed = int(torch.randint(0, MAX_SEED, (), dtype=torch.int64).item()) if dropout_p > 0 else 0
    out, _ = scaled_dot_product_attention_op(
        query,
        key,
        value,
        attn_mask,
        float(dropout_p),
        bool(is_causal),
        scale,
        bool(enable_gqa),
        alibi_slopes,
        sinks,
        window[0],
        window[1],
        str(getattr(alignment, "value", alignment)),
        softcap,
        seed,
    )
    return out


# ---- fp8 forward --------------------------------------------------------------------------------------

FP8_OPTIONS = "bool is_causal, float? scale, bool enable_gqa, int? window_left, int? window_right, str alignment"


def _fp8_options(
    is_causal: bool, scale: float | None, enable_gqa: bool, window: tuple[int | None, int | None], alignment: Any
) -> tuple[Any, ...]:
    """The fp8 operators' options (FP8_OPTIONS) from their calls' keywords."""
    return bool(is_causal), scale, bool(enable_gqa), window[0], window[1], str(getattr(alignment, "value", alignment))


def _fp8_forward_fake(query: Tensor, key: Tensor, value: Tensor, *rest: Any) -> Any:
    enable_gqa, out_dtype = rest[8], rest[-1]
    out = _out_fake(query, key, value, enable_gqa, query.dtype if out_dtype is None else out_dtype)
    amax = [empty_packed(query, (1,), torch.float32) for _ in range(2)]
    return out, empty_packed(query, out.shape[:-1], torch.float32), *amax


def _fp8_forward(query: Tensor, key: Tensor, value: Tensor, *rest: Any) -> Any:
    factors, (is_causal, scale, enable_gqa, window_left, window_right, alignment, out_dtype) = rest[:6], rest[6:]
    options = (0.0, is_causal, scale, enable_gqa, None, None, window_left, window_right, alignment, None, 0)
    return F.scaled_dot_product_attention(
        query,
        key,
        value,
        **_keywords(*options),
        **dict(zip(FP8_SCALES, factors)),
        out_dtype=out_dtype,
        return_stats=True,
        return_amax=True,
    )


scaled_dot_product_attention_fp8_op = define(
    "scaled_dot_product_attention_fp8(Tensor query, Tensor key, Tensor value, Tensor descale_q, Tensor descale_k,"
    " Tensor descale_v, Tensor descale_s, Tensor scale_s, Tensor scale_o, "
    + FP8_OPTIONS
    + ", ScalarType? out_dtype) -> (Tensor, Tensor, Tensor, Tensor)",
    _fp8_forward,
    _fp8_forward_fake,
)


def _fp8_backward(ctx: Any, *grads: Any) -> Any:
    raise as_torch_error(
        NotSupported(
            "opendnn::scaled_dot_product_attention_fp8 has no gradient: an fp8 training step needs "
            "scales the caller manages (dO quantized with its own scale, the backward's twelve factors); "
            "call opendnn::scaled_dot_product_attention_fp8_backward with them, or run the attention in "
            "bfloat16 or float16"
        )
    )


register_autograd(scaled_dot_product_attention_fp8_op, _fp8_backward, lambda ctx, inputs, output: None)


def scaled_dot_product_attention_fp8(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    descale_q: Tensor,
    descale_k: Tensor,
    descale_v: Tensor,
    descale_s: Tensor,
    scale_s: Tensor,
    scale_o: Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    window: tuple[int | None, int | None] = (None, None),
    alignment: str = "top_left",
    out_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """cuDNN's fp8 SDPA forward on the ``opendnn::scaled_dot_product_attention_fp8`` operator: query,
    key and value float8_e4m3fn or float8_e5m2 (torch's SDPA shapes), the per-tensor factors as
    one-element float32 tensors on their device (read by the kernel, never by the host, so a CUDA
    graph may capture the call while the factors change), out in ``out_dtype`` (default: query's;
    fp8, bfloat16 or float16). A gradient through it raises: the backward is
    ``scaled_dot_product_attention_fp8_backward``, with the caller's factors.

    Returns:
        (out, stats, amax_s, amax_o): stats the rows' logsumexp (float32), amax_s the largest softmax
        weight and amax_o the largest |out| before scale_o (one-element float32 tensors);
        ``opendnn.families.attention.reference`` gives the formula.
    """
    factors = (descale_q, descale_k, descale_v, descale_s, scale_s, scale_o)
    options = _fp8_options(is_causal, scale, enable_gqa, window, alignment)
    out, stats, amax_s, amax_o = scaled_dot_product_attention_fp8_op(query, key, value, *factors, *options, out_dtype)
    return out, stats, amax_s, amax_o


# ---- fp8 backward -------------------------------------------------------------------------------------


def _fp8_backward_fake(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, *rest: Any) -> Any:
    grad_dtype = rest[-1] or query.dtype
    grads = [_outputs_like(t, t.shape, grad_dtype) for t in (query, key, value)]
    return *grads, *(empty_packed(query, (1,), torch.float32) for _ in range(4))


def _fp8_backward_call(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, stats: Tensor, *rest: Any
) -> Any:
    factors, (is_causal, scale, enable_gqa, window_left, window_right, alignment, grad_dtype) = rest[:12], rest[12:]
    options = (0.0, is_causal, scale, enable_gqa, None, None, window_left, window_right, alignment, None, 0)
    return F.scaled_dot_product_attention_backward(
        grad_out,
        query,
        key,
        value,
        out,
        stats,
        **_keywords(*options),
        **dict(zip(FP8_BACKWARD_SCALES, factors)),
        grad_dtype=grad_dtype,
        return_amax=True,
    )


scaled_dot_product_attention_fp8_backward_op = define(
    "scaled_dot_product_attention_fp8_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value,"
    " Tensor out, Tensor stats, Tensor descale_q, Tensor descale_k, Tensor descale_v, Tensor descale_o,"
    " Tensor descale_do, Tensor descale_s, Tensor descale_dp, Tensor scale_s, Tensor scale_dq,"
    " Tensor scale_dk, Tensor scale_dv, Tensor scale_dp, "
    + FP8_OPTIONS
    + ", ScalarType? grad_dtype) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _fp8_backward_call,
    _fp8_backward_fake,
    differentiable=False,
)


def scaled_dot_product_attention_fp8_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    stats: Tensor,
    *,
    descale_q: Tensor,
    descale_k: Tensor,
    descale_v: Tensor,
    descale_o: Tensor,
    descale_do: Tensor,
    descale_s: Tensor,
    descale_dp: Tensor,
    scale_s: Tensor,
    scale_dq: Tensor,
    scale_dk: Tensor,
    scale_dv: Tensor,
    scale_dp: Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    window: tuple[int | None, int | None] = (None, None),
    alignment: str = "top_left",
    grad_dtype: torch.dtype | None = None,
) -> tuple[Tensor, ...]:
    """cuDNN's fp8 SDPA backward on the ``opendnn::scaled_dot_product_attention_fp8_backward``
    operator: the forward's query, key, value, out and stats (``scaled_dot_product_attention_fp8``'s,
    under its own options), grad_out float8_e4m3fn or float8_e5m2 (quantized by the caller, whose
    scale ``descale_do`` undoes), the twelve per-tensor factors as one-element float32 tensors on
    their device (read by the kernels, never by the host), the gradients in ``grad_dtype`` (default:
    query's; fp8, bfloat16 or float16).

    Returns:
        (grad_query, grad_key, grad_value, amax_dq, amax_dk, amax_dv, amax_dp): the gradients of
        their input's shapes, then the largest |dQ|, |dK|, |dV| before their scales and the largest
        |dS| before scale_dp (one-element float32 tensors); ``opendnn.families.attention.reference``
        gives the formula.
    """
    descales = (descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp)
    scales = (scale_s, scale_dq, scale_dk, scale_dv, scale_dp)
    options = _fp8_options(is_causal, scale, enable_gqa, window, alignment)
    grads = scaled_dot_product_attention_fp8_backward_op(
        grad_out, query, key, value, out, stats, *descales, *scales, *options, grad_dtype
    )
    return tuple(grads)
