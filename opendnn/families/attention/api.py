"""Attention as cuDNN's SDPA: ``attention_forward`` and ``attention_backward`` over descriptors.

The parameters (scale, causal mask and its alignment, sliding window, softcap, dropout) live in an
AttentionDescriptor; the tensors are given as descriptor and array pairs of any strides (see
``opendnn.families.attention.problem`` for the formulas, the masks and the dims). Optional tensors:
stats (the per-row logsumexp the backward needs), a bias (float: added to the scores; BOOLEAN: a
mask, True where the key takes part) and per-batch sequence lengths of the queries and keys. The
outputs must not overlap the inputs.
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import BadParam, Status
from opendnn.core.handle import Handle, MathType
from opendnn.families.attention.problem import AttentionDescriptor, AttentionTensors, attention_problem


def attention_forward(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    q: Any,
    k_desc: TensorDescriptor,
    k: Any,
    v_desc: TensorDescriptor,
    v: Any,
    o_desc: TensorDescriptor,
    o: Any,
    *,
    stats_desc: TensorDescriptor | None = None,
    stats: Any = None,
    bias_desc: TensorDescriptor | None = None,
    bias: Any = None,
    seq_lens_q_desc: TensorDescriptor | None = None,
    seq_lens_q: Any = None,
    seq_lens_kv_desc: TensorDescriptor | None = None,
    seq_lens_kv: Any = None,
) -> None:
    """``o = softmax(mask(softcap(scale * q k^T) + bias)) v`` with dropout, and the rows' logsumexp
    into ``stats`` when given (dims (B, Hq, Sq), FLOAT).

    Raises:
        BadParam: dims that disagree, a tensor past its buffer or on another device, an overlapping
            output, an array given without its descriptor (or the reverse).
        NotSupported: a non-float dtype, a head dim outside 8..256.
    """
    problem = attention_problem(
        attn_desc,
        q_desc,
        k_desc,
        v_desc,
        o_desc,
        stats=stats_desc,
        bias=bias_desc,
        seq_lens_q=seq_lens_q_desc,
        seq_lens_kv=seq_lens_kv_desc,
        allow_tf32=handle.math_type is MathType.TENSOR_OP,
    )
    tensors = AttentionTensors(
        bind("q", q_desc, q),
        bind("k", k_desc, k),
        bind("v", v_desc, v),
        bind("o", o_desc, o, output=True),
        stats=_bind_optional("stats", stats_desc, stats, output=True),
        bias=_bind_optional("bias", bias_desc, bias),
        seq_lens_q=_bind_optional("seq_lens_q", seq_lens_q_desc, seq_lens_q),
        seq_lens_kv=_bind_optional("seq_lens_kv", seq_lens_kv_desc, seq_lens_kv),
    )
    dispatch(handle, "attention", problem, tensors)


def attention_backward(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    q: Any,
    k_desc: TensorDescriptor,
    k: Any,
    v_desc: TensorDescriptor,
    v: Any,
    o_desc: TensorDescriptor,
    o: Any,
    do_desc: TensorDescriptor,
    do: Any,
    stats_desc: TensorDescriptor,
    stats: Any,
    dq_desc: TensorDescriptor,
    dq: Any,
    dk_desc: TensorDescriptor,
    dk: Any,
    dv_desc: TensorDescriptor,
    dv: Any,
    *,
    bias_desc: TensorDescriptor | None = None,
    bias: Any = None,
    dbias_desc: TensorDescriptor | None = None,
    dbias: Any = None,
    seq_lens_q_desc: TensorDescriptor | None = None,
    seq_lens_q: Any = None,
    seq_lens_kv_desc: TensorDescriptor | None = None,
    seq_lens_kv: Any = None,
) -> None:
    """dq, dk, dv (and dbias, of the bias's dims, when given) from the forward's o and stats and the
    gradient do, with the forward's own attn_desc (the dropout mask is regenerated from its seed).

    Raises:
        BadParam: as attention_forward; stats, dq, dk or dv missing; dbias without a float bias.
        NotSupported: as attention_forward; dbias of a BOOLEAN mask.
    """
    problem = attention_problem(
        attn_desc,
        q_desc,
        k_desc,
        v_desc,
        o_desc,
        stats=stats_desc,
        bias=bias_desc,
        seq_lens_q=seq_lens_q_desc,
        seq_lens_kv=seq_lens_kv_desc,
        do=do_desc,
        dq=dq_desc,
        dk=dk_desc,
        dv=dv_desc,
        dbias=dbias_desc,
        allow_tf32=handle.math_type is MathType.TENSOR_OP,
    )
    tensors = AttentionTensors(
        bind("q", q_desc, q),
        bind("k", k_desc, k),
        bind("v", v_desc, v),
        bind("o", o_desc, o),
        stats=bind("stats", stats_desc, stats),
        bias=_bind_optional("bias", bias_desc, bias),
        seq_lens_q=_bind_optional("seq_lens_q", seq_lens_q_desc, seq_lens_q),
        seq_lens_kv=_bind_optional("seq_lens_kv", seq_lens_kv_desc, seq_lens_kv),
        do=bind("do", do_desc, do),
        dq=bind("dq", dq_desc, dq, output=True),
        dk=bind("dk", dk_desc, dk, output=True),
        dv=bind("dv", dv_desc, dv, output=True),
        dbias=_bind_optional("dbias", dbias_desc, dbias, output=True),
    )
    dispatch(handle, "attention", problem, tensors)


def _bind_optional(name: str, desc: TensorDescriptor | None, array: Any, *, output: bool = False) -> Bound | None:
    if desc is None:
        if array is not None:
            raise BadParam(f"{name}_desc=None but {name} is given", Status.BAD_PARAM_NULL_POINTER)
        return None
    return bind(name, desc, array, output=output)
