"""Randomly drawn problems, each against torch in float64 on the Triton kernels (through Triton's
interpreter) and on the NumPy backend: shapes, dtypes, memory orders and strides that no sample table
lists. Every tensor comes in a random dimension order, some as sub-regions of larger buffers or every other
element of one, and a size-1 dim may carry any stride (as views of sliced or broadcast tensors do). Seeds are fixed: a
failure names its draw, and the same draw repeats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

BACKENDS = ["numpy", "triton"]
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11, torch.bfloat16: 2e-2, torch.float16: 2e-2}
DRAWS = 24


def laid_out(rng: np.random.Generator, values: torch.Tensor) -> torch.Tensor:
    """``values`` in a random dimension order, maybe inside a larger buffer or in every other element of
    one, a size-1 dim maybe strided."""
    order = [int(k) for k in rng.permutation(values.ndim)]
    stored = values.permute(*order).contiguous()
    if rng.random() < 0.3:
        buffer = torch.zeros([n + 2 for n in stored.shape], dtype=values.dtype)
        region = tuple(slice(1, 1 + n) for n in stored.shape)
        buffer[region] = stored
        stored = buffer[region]
    out = stored.permute(*[order.index(k) for k in range(values.ndim)])
    if rng.random() < 0.5 and 1 in out.shape:
        strides = [int(rng.integers(1, 50)) if n == 1 else s for n, s in zip(out.shape, out.stride())]
        out = out.as_strided(out.shape, strides)
    if rng.random() < 0.2:
        spread = torch.zeros(*out.shape[:-1], 2 * out.shape[-1], dtype=values.dtype)
        spread[..., ::2] = out
        out = spread[..., ::2]
    return out


def random_tensor(rng: np.random.Generator, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    return laid_out(rng, torch.from_numpy(rng.standard_normal(shape)).to(dtype))


def sizes(rng: np.random.Generator, count: int, low: int = 1, high: int = 7) -> list[int]:
    return [int(rng.integers(low, high)) for _ in range(count)]


def draw_norm(rng: np.random.Generator, dtype: torch.dtype) -> tuple[str, object, object]:
    """A layer, RMS, group or instance norm with parameters of random strides: (its name, opendnn's
    call, torch's call)."""
    kind = ["layer", "rms", "group", "instance"][int(rng.integers(0, 4))]
    if kind in ("layer", "rms"):
        shape = sizes(rng, int(rng.integers(2, 5)))
        normalized = shape[-int(rng.integers(1, len(shape))) :]
        x, w, b = (random_tensor(rng, s, dtype) for s in (shape, normalized, normalized))
        if kind == "layer":
            return (
                f"layer {shape} over {normalized}",
                lambda h: F.layer_norm(x, normalized, w, b, handle=h),
                (lambda: TF.layer_norm(x.double(), normalized, w.double(), b.double())),
            )
        eps = torch.finfo(dtype).eps  # torch's default for the input's dtype, opendnn's too
        return (
            f"rms {shape} over {normalized}",
            lambda h: F.rms_norm(x, normalized, w, handle=h),
            (lambda: TF.rms_norm(x.double(), normalized, w.double(), eps=eps)),
        )
    groups = int(rng.integers(1, 4)) if kind == "group" else 0
    channels = (groups or 1) * int(rng.integers(1, 4))
    shape = [int(rng.integers(1, 4)), channels, *sizes(rng, int(rng.integers(1, 3)), 2)]
    x, w, b = (
        random_tensor(rng, shape, dtype),
        random_tensor(rng, [channels], dtype),
        random_tensor(rng, [channels], dtype),
    )
    if kind == "group":
        return (
            f"group {shape} in {groups}",
            lambda h: F.group_norm(x, groups, w, b, handle=h),
            (lambda: TF.group_norm(x.double(), groups, w.double(), b.double())),
        )
    return (
        f"instance {shape}",
        lambda h: F.instance_norm(x, w, b, handle=h),
        (lambda: TF.instance_norm(x.double(), weight=w.double(), bias=b.double())),
    )


def draw_pointwise(rng: np.random.Generator, dtype: torch.dtype) -> tuple[object, ...]:
    """A broadcast binary operation, or a layout and dtype transform."""
    shape = sizes(rng, int(rng.integers(1, 6)))
    if rng.random() < 0.5:
        other = [n if rng.random() < 0.6 else 1 for n in shape][int(rng.integers(0, len(shape))) :]
        a, b = random_tensor(rng, shape, dtype), random_tensor(rng, other, dtype)
        name = ["add", "mul", "maximum", "sub"][int(rng.integers(0, 4))]
        return (
            f"{name} {shape} with {other}",
            lambda h: getattr(F, name)(a, b, handle=h),
            (lambda: getattr(torch, name)(a.double(), b.double())),
        )
    x = random_tensor(rng, shape, dtype)
    order = tuple(int(k) for k in rng.permutation(len(shape)))
    target = torch.float32 if dtype.itemsize == 2 else DTYPES[int(rng.integers(0, len(DTYPES)))]
    return (
        f"transform {shape} to {order} in {target}",
        lambda h: F.transform(x, order, dtype=target, handle=h),
        lambda: x.to(target).double(),  # (rounded as opendnn's output is)
        target,
    )


def draw_resample(rng: np.random.Generator, dtype: torch.dtype) -> tuple[str, object, object]:
    """An interpolation of 1 to 3 spatial dims to random sizes, forward and backward checked together."""
    spatial = int(rng.integers(1, 4))
    x = random_tensor(rng, [int(rng.integers(1, 3)), int(rng.integers(1, 4)), *sizes(rng, spatial, 1, 9)], dtype)
    out = sizes(rng, spatial, 1, 14)
    mode = ["nearest", "nearest-exact", ["linear", "bilinear", "trilinear"][spatial - 1]][int(rng.integers(0, 3))]
    dy = random_tensor(rng, [*x.shape[:2], *out], dtype)

    def ours(h: od.Handle) -> torch.Tensor:
        y = F.interpolate(x, out, mode=mode, handle=h)
        return torch.cat(
            [y.double().reshape(-1), F.interpolate_backward(dy, x, out, mode=mode, handle=h).double().reshape(-1)]
        )

    def torchs() -> torch.Tensor:
        source = x.double().requires_grad_()
        y = TF.interpolate(source, size=out, mode=mode)
        y.backward(dy.double())
        return torch.cat([y.detach().reshape(-1), source.grad.reshape(-1)])

    return f"{mode} {list(x.shape)} to {out}", ours, torchs


def draw_attention(rng: np.random.Generator, dtype: torch.dtype) -> tuple[str, object, object]:
    """Scaled dot-product attention (grouped heads, causal or masked, a scale), forward and backward
    checked together."""
    dtype = torch.float32 if dtype == torch.float64 else dtype  # (torch's float64 SDPA is the reference)
    batch, heads_kv, group = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.choice([1, 2]))
    queries, keys = int(rng.integers(1, 33)), int(rng.integers(1, 33))
    dim, value_dim = int(rng.choice([8, 16, 24, 40])), int(rng.choice([8, 16, 32]))
    q = random_tensor(rng, [batch, heads_kv * group, queries, dim], dtype)
    k, v = (
        random_tensor(rng, [batch, heads_kv, keys, dim], dtype),
        random_tensor(rng, [batch, heads_kv, keys, value_dim], dtype),
    )
    do = random_tensor(rng, [batch, heads_kv * group, queries, value_dim], dtype)
    causal = bool(rng.random() < 0.4)
    mask = None if causal or rng.random() < 0.5 else random_tensor(rng, [1, 1, queries, keys], dtype)
    options = dict(attn_mask=mask, is_causal=causal, scale=float(rng.uniform(0.1, 0.5)), enable_gqa=group > 1)

    def ours(h: od.Handle) -> torch.Tensor:
        o, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, handle=h, **options)
        grads = F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, handle=h, **options)
        return torch.cat([t.double().reshape(-1) for t in (o, *grads)])

    def torchs() -> torch.Tensor:
        inputs = [t.double().requires_grad_() for t in (q, k, v)]
        widened = {**options, "attn_mask": None if mask is None else mask.double()}
        o = TF.scaled_dot_product_attention(*inputs, **widened)
        o.backward(do.double())
        return torch.cat([o.detach().reshape(-1), *(t.grad.reshape(-1) for t in inputs)])

    shapes = f"q {list(q.shape)} k {list(k.shape)} v {list(v.shape)}"
    return f"attention {shapes} causal={causal} mask={mask is not None}", ours, torchs, dtype


DRAWN = {"attention": draw_attention, "norm": draw_norm, "pointwise": draw_pointwise, "resample": draw_resample}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", sorted(DRAWN))
def test_random_problems_match_torch(family, backend):
    rng = np.random.default_rng(sorted(DRAWN).index(family))
    handle = od.Handle(backend=backend)
    for draw in range(DRAWS):
        dtype = DTYPES[int(rng.integers(0, len(DTYPES)))]
        name, ours, torchs, *result = DRAWN[family](rng, dtype)
        tolerance = max([TOLERANCE[dtype], *(TOLERANCE[d] for d in result)])  # (a transform's output dtype)
        expected = torchs()
        error = relative_error(ours(handle), expected)
        assert error < tolerance, f"draw {draw}: {name} {dtype}: relative error {error:.3g}"
