import sys
sys.path.insert(0, "tests")
import numpy as np, torch
import opendnn as od
import test_gluon_attention as T
from opendnn.families.attention import triton_backend, gluon_forward
from opendnn.families.attention.api import attention_forward
from opendnn.families.attention.problem import AttentionDescriptor, FP8_SCALES, FP8_AMAX
from opendnn.families.attention.reference import reference_forward_fp8
from opendnn.families.attention.samples import fp8_factors
DEVICE = "cuda:0"

def run(name, gluon):
    shapes, layout, out_name, fields = T.E4M3_GPU_CASES[name]
    g = torch.Generator(DEVICE).manual_seed(len(name))
    q, k, v = (2 * t for t in T.gpu_inputs(torch.float32, shapes, layout, g))
    q, k, v = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    batch, hq, _, sq, skv, dim = shapes
    out_dtype = getattr(torch, out_name)
    o = torch.full((batch, hq, sq, dim), float("nan"), device=DEVICE).to(out_dtype)
    stats = torch.full((batch, hq, sq), float("nan"), device=DEVICE)
    factors = fp8_factors(od.DataType.FP8_E4M3)
    scalars = {s: torch.tensor([x], device=DEVICE) for s, x in zip(FP8_SCALES, factors)}
    scalars |= {s: torch.full((1,), float("nan"), device=DEVICE) for s in FP8_AMAX}
    d = od.TensorDescriptor
    kw = {kk: vv for s, t in scalars.items() for kk, vv in ((f"{s}_desc", d(t.dtype, t.shape)), (s, t))}
    params = AttentionDescriptor(**fields)
    tensors = [it for t in (q, k, v, o) for it in (d(t.dtype, t.shape, t.stride()), t)]
    saved = triton_backend.warp_specialized
    if not gluon:
        triton_backend.warp_specialized = lambda *a: False
    try:
        attention_forward(od.create(DEVICE), params, *tensors, stats_desc=d(stats.dtype, stats.shape), stats=stats, **kw)
    finally:
        triton_backend.warp_specialized = saved
    torch.cuda.synchronize()
    vals = [t.double().cpu().numpy() for t in (q, k, v)]
    ref = reference_forward_fp8(params, *vals, factors, od.DataType.FP8_E4M3, od.DataType.of(out_dtype))
    ours = o.double().cpu().numpy()
    err = np.abs(ours - ref.o)
    rel = np.linalg.norm(ours - ref.o) / np.linalg.norm(ref.o)
    mism = np.mean(ours != ref.o)
    rowerr = np.sqrt((err ** 2).sum(-1)) / (np.sqrt((ref.o ** 2).sum(-1)) + 1e-30)
    worst = np.unravel_index(np.argmax(rowerr), rowerr.shape)
    buckets = [float(np.sqrt((err[:, :, i:i+128] ** 2).sum() / max((ref.o[:, :, i:i+128] ** 2).sum(), 1e-30))) for i in range(0, sq, 128)]
    lse = stats.double().cpu().numpy(); fin = np.isfinite(ref.lse)
    ld = np.abs(lse - ref.lse); ld[~fin] = 0
    lw = np.unravel_index(np.argmax(ld), ld.shape)
    print(f"{name:50s} {'gluon' if gluon else 'tl   '} rel={rel:.2e} mism={mism:.3f} worst_row={worst} rowerr={rowerr.max():.2e} "
          f"lse_maxdiff={ld.max():.2e} at {lw} amax_s={scalars['amax_s'].item()/ref.amax_s-1:+.1e} amax_o={scalars['amax_o'].item()/ref.amax_o-1:+.1e}")
    print("   buckets(128 rows):", " ".join(f"{b:.3f}" for b in buckets))

for name in T.E4M3_GPU_CASES:
    for gl_ in (True, False):
        run(name, gl_)
