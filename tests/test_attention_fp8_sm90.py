"""The fp8 attention forward compiled for the H200 (sm_90) on the CPU at the tiles the planner picks
for e4m3 and e5m2 data with head dims 64, 128 and 256, causal and not, o in bfloat16 and in the data's
fp8 type (GQA 8/2, 4096 queries and keys): both products run as fp8 warpgroup MMAs (``wgmma`` with
e4m3 or e5m2 operands), no register spills, shared memory within the 227 KB a block may take on an
H200. In a subprocess: triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sm90

HEAD_DIMS = (64, 128, 256)
DTYPES = (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"))
OUTPUTS = ("bfloat16", "fp8")
H200_SHARED_BYTES = 227 * 1024  # the most shared memory one block may take on an H200


def test_fp8_tiles_run_fp8_wgmma_without_spills_within_shared_memory():
    completed = sm90.run_script(__file__, timeout=1800)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line.split() for line in completed.stdout.splitlines() if line.startswith("attention_")]
    assert sorted((row[1], int(row[2]), row[3], row[4]) for row in rows) == sorted(
        (dtype, head_dim, out, causal)
        for dtype, _ in DTYPES
        for head_dim in HEAD_DIMS
        for out in OUTPUTS
        for causal in ("causal", "full")
    )
    for row in rows:
        fp8_products, registers, spills, shared = map(int, row[-4:])
        assert fp8_products >= 2, row  # q k^T and p v
        assert spills == 0 and registers <= 255, row
        assert shared <= H200_SHARED_BYTES, row


def main() -> None:
    """Print, per data dtype, head dim, output and mask: the tile (BLOCK_M, BLOCK_N, warps, stages), the
    fp8 wgmma instructions in the PTX, the registers a thread, the bytes spilled and the shared memory
    bytes of the forward kernel compiled for sm_90."""
    import torch
    from test_attention_kernels import LaunchRecorder

    import opendnn as od
    from opendnn.core.arrays import bind
    from opendnn.families.attention import triton_backend
    from opendnn.families.attention.problem import FP8_AMAX, FP8_SCALES, AttentionTensors, attention_problem

    target, backend = sm90.target_or_exit()
    launches: list = []
    triton_backend.attention_forward_kernel = LaunchRecorder(triton_backend.attention_forward_kernel, launches)
    for dtype, short in DTYPES:
        for head_dim in HEAD_DIMS:
            for out in OUTPUTS:
                for causal in (False, True):
                    launches.clear()
                    dims = dict(q=(2, 8, 4096, head_dim), k=(2, 2, 4096, head_dim), v=(2, 2, 4096, head_dim))
                    types = dict(q=dtype, k=dtype, v=dtype, o=dtype if out == "fp8" else out, stats="float32")
                    dims.update(o=dims["q"], stats=(2, 8, 4096), **{slot: (1,) for slot in (*FP8_SCALES, *FP8_AMAX)})
                    types.update({slot: "float32" for slot in (*FP8_SCALES, *FP8_AMAX)})
                    descs = {slot: od.TensorDescriptor(types[slot], size) for slot, size in dims.items()}
                    bound = {
                        slot: bind(slot, desc, torch.empty(dims[slot], dtype=getattr(torch, types[slot])))
                        for slot, desc in descs.items()
                    }
                    params = od.AttentionDescriptor(causal=causal)
                    triton_backend.run(attention_problem(params, **descs), AttentionTensors(**bound))
                    for kernel, args, kwargs in launches:
                        options, signature, constexprs, attrs = sm90.specialize(kernel, args, kwargs, backend)
                        compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, options, target)
                        ptx = compiled.asm["ptx"]
                        fp8_products = sum("wgmma" in line and f".{short}.{short}" in line for line in ptx.splitlines())
                        registers, spills = sm90.ptxas_usage(ptx, 90)
                        tile = (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"])
                        mask = "causal" if causal else "full"
                        shared = compiled.metadata.shared
                        print(
                            kernel.__name__, dtype, head_dim, out, mask, *tile, fp8_products, registers, spills, shared
                        )


if __name__ == "__main__":
    main()
