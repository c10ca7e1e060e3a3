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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import opendnn.functional as F
from opendnn.families.attention.descriptor import MAX_SEED
from opendnn.families.attention.functional import broadcast_shapes
from opendnn.torch.library import (
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


def _outputs_like(query: Tensor, shape: Sequence[Any]) -> Tensor:
    """An output of ``shape`` laid out as opendnn.functional lays it: in query's memory order for
    4-dim inputs, packed for the other ranks."""
    return empty_in_order_of(query, shape) if query.ndim == 4 else empty_packed(query, shape)


def _forward_fake(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *options: Any) -> Any:
    shape = broadcast_shapes(tuple(query.shape), tuple(key.shape), tuple(value.shape), bool(options[3]))
    broadcast = list(shape[:-1]) != list(query.shape[:-1])  # a broadcast query's output is packed
    out = empty_packed(query, shape) if broadcast else _outputs_like(query, shape)
    return out, empty_packed(query, shape[:-1], compute_dtype(query.dtype))


def _forward(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, *options: Any) -> Any:
    return F.scaled_dot_product_attention(query, key, value, attn_mask, return_stats=True, **_keywords(*options))


scaled_dot_product_attention_op = define(
    "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
    + OPTIONS
    + ") -> (Tensor, Tensor)",
    _forward,
    _forward_fake,
    autocast=lower_precision,
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
) -> list[Tensor]:
    *rest, mask_grad = options
    sinks = rest[5]
    grads = [_outputs_like(t, t.shape) for t in (query, key, value)]
    if mask_grad and attn_mask is not None:
        grads.append(empty_packed(attn_mask, attn_mask.shape))
    if sinks is not None:
        grads.append(empty_packed(sinks, sinks.shape))
    return grads


def _backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    stats: Tensor,
    attn_mask: Tensor | None,
    *options: Any,
) -> list[Tensor]:
    *rest, mask_grad = options
    grads = F.scaled_dot_product_attention_backward(
        grad_out, query, key, value, out, stats, attn_mask, mask_grad=mask_grad, **_keywords(*rest)
    )
    return [g.contiguous() if k >= 3 else g for k, g in enumerate(grads)]  # the mask's and sinks' packed


scaled_dot_product_attention_backward_op = define(
    "scaled_dot_product_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out,"
    " Tensor stats, Tensor? attn_mask, " + OPTIONS + ", bool mask_grad) -> Tensor[]",
    _backward,
    _backward_fake,
    differentiable=False,
)

_MASK, _SINKS = 3, 9  # the positions of attn_mask and sinks among the operator's inputs


def _save(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    query, key, value, attn_mask, *options = inputs
    out, stats = output
    ctx.save_for_backward(query, key, value, out, stats, attn_mask, options[4], options[5])
    ctx.options = options


def _attention_backward(ctx: Any, grad_out: Tensor | None, grad_stats: Tensor | None) -> tuple[Any, ...]:
    nothing = (None,) * (4 + len(ctx.options))
    if grad_out is None:
        return nothing
    query, key, value, out, stats, attn_mask, alibi_slopes, sinks = ctx.saved_tensors
    options = list(ctx.options)
    options[4], options[5] = alibi_slopes, sinks
    mask_grad = attn_mask is not None and attn_mask.is_floating_point() and ctx.needs_input_grad[_MASK]
    grads = scaled_dot_product_attention_backward_op(
        dense(grad_out, out), query, key, value, out, stats, attn_mask, *options, mask_grad
    )
    results: list[Any] = [*(g if ctx.needs_input_grad[k] else None for k, g in enumerate(grads[:3]))]
    results += [None] * (len(nothing) - 3)
    if mask_grad:
        results[_MASK] = grads[3]
    if sinks is not None and ctx.needs_input_grad[_SINKS]:
        results[_SINKS] = grads[-1]
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
