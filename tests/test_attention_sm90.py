"""The attention kernels compiled for the H200 (sm_90) on the CPU at the tiles the planner picks for
bfloat16 with head dims 64, 128 and 256, causal and not (the benchmark's shapes: GQA 8/2, 4096
queries and keys): no register spills beyond those of the two head-dim-128 tiles the H200 sweep measured
fastest anyway, and the shared memory of each kernel within the 227 KB a block may take on an H200. In a
subprocess: triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sm90

HEAD_DIMS = (64, 128, 256)
KERNELS = ("attention_forward_kernel", "attention_delta_kernel", "attention_dkdv_kernel", "attention_dq_kernel")
H200_SHARED_BYTES = 227 * 1024  # the most shared memory one block may take on an H200
# bytes a thread spills, at most, in the planned tiles that spill (4 warps at head dim 128); the others spill none
SPILLED_BYTES = {("attention_forward_kernel", 128): 212, ("attention_dkdv_kernel", 128): 8}


def test_planned_tiles_spill_no_more_than_measured_nor_overflow_shared_memory():
    completed = sm90.run_script(__file__, timeout=1800)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line.split() for line in completed.stdout.splitlines() if line.startswith("attention_")]
    assert sorted((row[0], int(row[1]), row[2]) for row in rows) == sorted(
        (kernel, head_dim, causal) for kernel in KERNELS for head_dim in HEAD_DIMS for causal in ("causal", "full")
    )
    for row in rows:
        registers, spills, shared = map(int, row[-3:])
        assert spills <= SPILLED_BYTES.get((row[0], int(row[1])), 0) and registers <= 255, row
        assert shared <= H200_SHARED_BYTES, row


def main() -> None:
    """Print, per kernel, head dim and mask: the tile (BLOCK_M, BLOCK_N, warps, stages), the registers a
    thread, the bytes spilled and the shared memory bytes of the kernel compiled for sm_90."""
    from test_attention_kernels import LaunchRecorder, sm90_problem_tensors

    from opendnn.core.arrays import bind
    from opendnn.families.attention import triton_backend
    from opendnn.families.attention.problem import SLOTS, AttentionTensors, attention_problem

    target, backend = sm90.target_or_exit()
    launches: list = []
    for name in KERNELS:
        setattr(triton_backend, name, LaunchRecorder(getattr(triton_backend, name), launches))
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            launches.clear()
            shapes = (2, 8, 2, 4096, 4096, head_dim, head_dim)
            params, descs, tensors = sm90_problem_tensors(
                "bfloat16", shapes, None, dict(causal=causal), False, (None, False)
            )
            for slots in (("q", "k", "v", "o", "stats"), SLOTS):
                chosen = {slot: desc for slot, desc in descs.items() if slot in slots}
                bound = {slot: bind(slot, desc, tensors[slot]) for slot, desc in chosen.items()}
                triton_backend.run(attention_problem(params, **chosen), AttentionTensors(**bound))
            for kernel, args, kwargs in launches:
                options, signature, constexprs, attrs = sm90.specialize(kernel, args, kwargs, backend)
                compiled = sm90.compile_sm90(kernel, signature, constexprs, attrs, options, target)
                registers, spills = sm90.ptxas_usage(compiled.asm["ptx"], 90)
                tile = (kwargs["BLOCK_M"], kwargs.get("BLOCK_N", "-"), kwargs["num_warps"], kwargs["num_stages"])
                mask = "causal" if causal else "full"
                print(kernel.__name__, head_dim, mask, *tile, registers, spills, compiled.metadata.shared, flush=True)


if __name__ == "__main__":
    main()
