"""The fp8 attention backward compiled for the H200 (sm_90) on the CPU at the tiles the planner picks
for e4m3 data with dO in e4m3 and in e5m2, head dims 64 and 128, causal and not (GQA 8/2, 4096
queries and keys, fp8 gradients): the dK/dV and dQ kernels' products with fp8 operands run as fp8
warpgroup MMAs, within 255 registers a thread, their measured spills (8 bytes in the dK/dV kernel at head
dim 128, none elsewhere) and the 227 KB of shared memory
a block may take on an H200. In a subprocess: triton must load without its interpreter
(tests/sm90.py)."""

from __future__ import annotations

import sm90

HEAD_DIMS = (64, 128)
GRAD_DTYPES = ("float8_e4m3fn", "float8_e5m2")
KERNELS = ("attention_dkdv_kernel", "attention_dq_kernel")
FP8_PRODUCTS = {"attention_dkdv_kernel": 4, "attention_dq_kernel": 3}  # q k^T, dO v^T, and p^T dO, dS^T q or dS k
SPILLED_BYTES = {("attention_dkdv_kernel", 128): 8}  # as the 16-bit dK/dV kernel's (4 causal); none elsewhere
H200_SHARED_BYTES = 227 * 1024  # the most shared memory one block may take on an H200


def test_fp8_backward_kernels_run_fp8_wgmma_within_registers_and_shared_memory():
    completed = sm90.run_script(__file__, timeout=1800)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line.split() for line in completed.stdout.splitlines() if line.startswith("attention_")]
    assert sorted((row[0], row[1], int(row[2]), row[3]) for row in rows) == sorted(
        (kernel, grad, head_dim, causal)
        for kernel in KERNELS
        for grad in GRAD_DTYPES
        for head_dim in HEAD_DIMS
        for causal in ("causal", "full")
    )
    for row in rows:
        products, registers, spills, shared = map(int, row[-4:])
        assert products >= FP8_PRODUCTS[row[0]], row
        assert registers <= 255 and spills <= SPILLED_BYTES.get((row[0], int(row[2])), 0), row
        assert shared <= H200_SHARED_BYTES, row


def main() -> None:
    """Print, per kernel, dO dtype, head dim and mask: the tile (BLOCK_M, BLOCK_N, warps, stages), the
    wgmma instructions with fp8 operands in the PTX, the registers a thread, the bytes spilled and the
    shared memory bytes of the kernel compiled for sm_90."""
    import torch
    from test_attention_kernels import LaunchRecorder

    import opendnn as od
    from opendnn.core.arrays import bind
    from opendnn.families.attention import triton_backend
    from opendnn.families.attention.problem import FP8_BACKWARD_SCALES, AttentionTensors, attention_problem

    target, backend = sm90.target_or_exit()
    launches: list = []
    for name in ("attention_delta_kernel", *KERNELS):  # the delta kernel recorded, not compiled: no products
        setattr(triton_backend, name, LaunchRecorder(getattr(triton_backend, name), launches))
    for grad in GRAD_DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                launches.clear()
                data, stats = (2, 8, 4096, head_dim), (2, 8, 4096)
                dims = dict(q=data, k=(2, 2, 4096, head_dim), v=(2, 2, 4096, head_dim), o=data, do=data)
                dims.update(stats=stats, dq=data, dk=dims["k"], dv=dims["v"])
                types = {slot: "float8_e4m3fn" for slot in dims} | dict(do=grad, stats="float32")
                dims.update({slot: (1,) for slot in FP8_BACKWARD_SCALES})
                types.update({slot: "float32" for slot in FP8_BACKWARD_SCALES})
                descs = {slot: od.TensorDescriptor(types[slot], size) for slot, size in dims.items()}
                bound = {
                    slot: bind(slot, desc, torch.empty(dims[slot], dtype=getattr(torch, types[slot])))
                    for slot, desc in descs.items()
                }
                params = od.AttentionDescriptor(causal=causal)
                triton_backend.run(attention_problem(params, **descs), AttentionTensors(**bound))
                for kernel, args, kwargs in launches[1:]:
                    options, signature, constexprs, attrs = sm90.specialize(kernel, args, kwargs, backend)
                    compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, options, target)
                    ptx = compiled.asm["ptx"]
                    products = sum("wgmma.mma_async" in line and ".e" in line for line in ptx.splitlines())
                    registers, spills = sm90.ptxas_usage(ptx, 90)
                    tile = (kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"], kwargs["num_stages"])
                    mask = "causal" if causal else "full"
                    shared = compiled.metadata.shared
                    print(kernel.__name__, grad, head_dim, mask, *tile, products, registers, spills, shared, flush=True)


if __name__ == "__main__":
    main()
