"""The warp-specialized backward filter (``convolution/gluon_filter.py``) without a GPU: its plans (tile,
slices, partial filters, the workspace they take) and its kernel compiled for sm_90 on the CPU, the
IR checked for the engine's parts. Run as a script, it prints one JSON line per compiled variant.
Its results on the H200 are checked by tests/test_gpu_convolution.py.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import sm90
from test_gluon_convolution import FILTER, FP16, SHARED_MEMORY, S, problem

from opendnn.families.convolution import gluon_filter
from opendnn.families.convolution import triton_backend as kernels

# name: (problem arguments, expected (chunks of 64 output channels, input channels of a tile, partial filters > 0))
VARIANTS = {
    "resnet50_l3_3x3": (dict(n=64, c=256, size=14, k=256), (2, 128, True)),
    "resnet50_l4_3x3_flip_beta": (dict(n=64, c=512, size=7, k=512, flip=True, beta=0.5), (2, 256, False)),
    "64_channels_pixel_halves": (dict(n=8, c=64, size=56, k=64), (1, 64, True)),
    "float16_odd_sizes": (dict(n=3, dtype=FP16, c=192, size=13, k=192), (2, 64, False)),
    "resnet50_l2_3x3_stride2": (dict(n=64, c=128, size=56, k=128, stride=2), (2, 128, True)),
}

CHECKED_FOR_SPILLS = ("resnet50_l3_3x3", "64_channels_pixel_halves")  # the partial filters' plain stores


def filter_problem(arguments):
    return problem(direction=FILTER, **arguments)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_split_chunks_tiles_by_the_channels_and_keeps_slices_of_whole_boxes(name):
    arguments, (k_chunks, block_c, partial) = VARIANTS[name]
    split = gluon_filter.filter_split(filter_problem(arguments))
    assert (split.k_chunks, split.block_c, split.partials > 0) == (k_chunks, block_c, partial)
    assert split.slice_boxes * (split.slices - 1) < split.slice_boxes * split.slices  # no empty slice
    halves = 2 if split.k_chunks == 1 else 1
    assert split.partials in (0, split.slices * halves)


def test_one_output_chunk_always_leaves_two_partials_a_slice():
    split = gluon_filter.filter_split(filter_problem(dict(n=8, c=64, size=56, k=64)))
    assert split.partials == 2 * split.slices  # each consumer sums half of every box's pixels


def test_the_plan_adds_the_partials_in_a_second_launch_within_the_workspace():
    arguments = VARIANTS["resnet50_l3_3x3"][0]
    prob = filter_problem(arguments)
    plan = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA)
    engine, total = plan.launches
    assert engine.kernel.__name__ == "filter_warp_specialized_kernel" and total.kernel.__name__ == "filter_sum_kernel"
    split = gluon_filter.filter_split(prob)
    assert engine.grid[0] == min(split.units, 132)
    (partial,) = [region for region in plan.regions if region[0] == "partial"]
    assert partial[2] - partial[1] >= split.partials * 256 * 256 * 9 * 4


def test_an_unsplit_filter_is_one_launch_writing_dw():
    prob = filter_problem(VARIANTS["resnet50_l4_3x3_flip_beta"][0])
    (engine,) = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA).launches
    assert engine.options["FLIP"] and engine.options["HAS_BETA"] and not engine.options["PARTIAL"]


@pytest.mark.parametrize("name", VARIANTS)
def test_the_ring_takes_at_least_three_stages_and_fits_in_shared_memory(name):
    split = gluon_filter.filter_split(filter_problem(VARIANTS[name][0]))
    stage_bytes = math.prod(split.box) * (split.k_chunks * 64 + split.block_c) * 2
    assert 3 <= split.stages and split.stages * stage_bytes <= SHARED_MEMORY - 1024


@pytest.mark.parametrize(
    "n, size, rows, multiple, expected",
    [
        (64, (14, 14), 128, 16, (32, 2, 2)),  # 64 14 x 14 images covered exactly
        (64, (7, 7), 100, 16, (64, 1, 1)),  # 128 pixels would leave too few stages
        (3, (13, 13), 128, 16, (1, 8, 16)),
        (64, (56, 56), 128, 32, (2, 8, 8)),
    ],
)
def test_the_box_covers_the_pixels_with_the_least_padding(n, size, rows, multiple, expected):
    assert gluon_filter.filter_box(n, size, rows, multiple) == expected


def test_every_variant_compiles_to_a_warp_specialized_wgmma_kernel_reading_both_operands_from_shared_memory():
    completed = sm90.run_script(__file__, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        _, (k_chunks, _, _) = VARIANTS[name]
        assert report["kernel"] == "filter_warp_specialized_kernel", name
        assert report["partitions"] == [4, 1] and report["warps"] == 12, name
        assert report["async_mma"] == 2 and report["synchronous_mma"] == 0, name  # one per consumer
        assert report["a_from_registers"] == 0 and report["shared_loads"] == 0, name
        assert report["transposed_a"] >= 2, name  # dy's box, permuted, is A
        assert report["tma_loads"] == k_chunks + 1 and report["box_rank"] == 5, name  # x's phase view
        assert {240, 24} <= set(report["registers"]), name
        assert report["shared"] <= SHARED_MEMORY, name
    for name in CHECKED_FOR_SPILLS:
        assert reports[name]["spilled"] == 0, name


def main() -> None:
    """Print, per variant, a JSON line: the kernel, its partitions' warps, total warps, asynchronous and
    synchronous wgmma ops, wgmma ops whose A is a register tensor, shared memory loads into registers,
    transposes of shared memory descriptors, TMA loads and the rank of their boxes, the setmaxnreg
    register counts, the shared memory and ptxas's spilled bytes."""
    import torch

    from opendnn.kernels.launch import Slot

    target, backend = sm90.target_or_exit()
    for name, (arguments, _) in VARIANTS.items():
        launch = gluon_filter.filter_warp_specialized_launch(filter_problem(arguments))
        torch_dtype = torch.float16 if arguments.get("dtype") is FP16 else torch.bfloat16
        tensors = {"x": torch.empty(8, dtype=torch_dtype), "y": torch.empty(8, dtype=torch_dtype)}
        tensors |= {"w": torch.empty(8, dtype=torch_dtype), "partial": torch.empty(8, dtype=torch.float32)}
        args = tuple(tensors[a.name] if isinstance(a, Slot) else a for a in launch.args)
        specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
        compiled = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target)
        ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
        box_ranks = re.findall(r"ttng\.async_tma_copy_global_to_local .*?\[([^\]]*)\]", ttgir)
        report = dict(
            name=name,
            kernel=compiled.metadata.name,
            partitions=[int(w) for w in re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir)],
            warps=compiled.metadata.num_warps,
            async_mma=len(re.findall(r"ttng\.warp_group_dot .*isAsync = true", ttgir)),
            synchronous_mma=len(re.findall(r"ttng\.warp_group_dot (?!.*isAsync = true)", ttgir)),
            a_from_registers=len(re.findall(r"ttng\.warp_group_dot %\S+, .*: tensor<", ttgir)),
            shared_loads=len(re.findall(r"ttg\.local_load ", ttgir)),
            transposed_a=len(re.findall(r"ttg\.memdesc_trans ", ttgir)),
            tma_loads=len(re.findall(r"ttng\.async_tma_copy_global_to_local ", ttgir)),
            box_rank=max(len(coords.split(",")) for coords in box_ranks) if box_ranks else 0,
            registers=sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            shared=compiled.metadata.shared,
            spilled=sm90.ptxas_usage(ptx, 90)[1],
        )
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
