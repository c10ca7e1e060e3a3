"""The blocks attention's kernels loop over, through the interpreter: for random query (key) blocks,
lengths, diagonal shifts and bands, the loops of ``key_range`` (``query_range``) and ``block_loop``
visit every key (query) block that holds a pair taking part, each once, none for a block wholly past
its own length, and take as interior (no mask) exactly the whole blocks whose every pair lies in the
band and inside the other side's length (the block's own padding past its length aside). The
programs' blocks: ``scheduled_block`` gives every block of a dense or ragged grid to one rank, once
(empty sequences, sequences of one row, lengths not multiples of the block), in reverse order within
a sequence when asked, and the spare ranks of a ragged grid blocks past their sequence's end."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from opendnn.families.attention import triton_tiles
from opendnn.families.attention.triton_tiles import block_loop, key_range, query_range, scheduled_block

MAX_VISITS = tl.constexpr(16)  # more than any case's blocks
MAX_SEQUENCES = tl.constexpr(8)  # at least any case's sequences: the offsets scheduled_block loads at once


@triton.jit
def visited_blocks_kernel(
    cases_ptr,
    visits_ptr,
    counts_ptr,
    KEYS: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program c: the blocks the loops of case c visit, in order, as (first index, EDGE) pairs."""
    case = tl.program_id(0)
    start = tl.load(cases_ptr + case * 6)
    len_q = tl.load(cases_ptr + case * 6 + 1)
    len_kv = tl.load(cases_ptr + case * 6 + 2)
    shift = tl.load(cases_ptr + case * 6 + 3)
    left = tl.load(cases_ptr + case * 6 + 4)
    right = tl.load(cases_ptr + case * 6 + 5)
    if KEYS:
        lo, hi, inner_lo, inner_hi = key_range(
            start, len_q, len_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N
        )
        block = BLOCK_N
    else:
        lo, hi, inner_lo, inner_hi = query_range(
            start, len_q, len_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N
        )
        block = BLOCK_M
    count = 0
    for EDGE in tl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for step in range(first, stop, block):
            tl.store(visits_ptr + (case * MAX_VISITS + count) * 2, step + tl.where(step < inner_lo, 0, gap))
            tl.store(visits_ptr + (case * MAX_VISITS + count) * 2 + 1, EDGE)
            count += 1
    tl.store(counts_ptr + case, count)


def taking_part(rows, columns, len_q, len_kv, shift, left, right):
    """[rows, columns] True where query i and key j take part (the reference's rule); with len_q
    (len_kv) None, padding queries (keys) take part too."""
    i, j = rows[:, None], columns[None, :]
    allowed = (i < (np.inf if len_q is None else len_q)) & (j < (np.inf if len_kv is None else len_kv))
    if left is not None:
        allowed &= j >= i + shift - left
    if right is not None:
        allowed &= j <= i + shift + right
    return allowed


@pytest.mark.parametrize("keys", [True, False], ids=["key_blocks", "query_blocks"])
@pytest.mark.parametrize("band", [(False, False), (True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize("blocks", [(16, 32), (32, 16)], ids=str)
def test_loops_visit_each_needed_block_once_and_the_interior_exactly(keys, band, blocks):
    has_left, has_right = band
    block_m, block_n = blocks
    own, other = (block_m, block_n) if keys else (block_n, block_m)
    rng = np.random.default_rng(sum(blocks) + 2 * has_left + has_right + 4 * keys)
    cases = []
    for _ in range(150):
        len_q, len_kv = (int(n) for n in rng.integers(0, 90, 2))
        shift = len_kv - len_q if rng.random() < 0.5 else 0  # BOTTOM_RIGHT or TOP_LEFT
        left, right = (int(n) for n in rng.integers(0, 50, 2))
        start = int(rng.integers(0, 100 // own)) * own
        cases.append((start, len_q, len_kv, shift, left, right))
    visits = torch.full((len(cases), MAX_VISITS, 2), -1, dtype=torch.int32)
    counts = torch.full((len(cases),), -1, dtype=torch.int32)
    visited_blocks_kernel[(len(cases),)](
        torch.tensor(cases, dtype=torch.int32), visits, counts, keys, has_left, has_right, block_m, block_n
    )
    for index, (case, count) in enumerate(zip(cases, counts.tolist())):
        start, len_q, len_kv, shift, left, right = case
        assert 0 <= count < MAX_VISITS, case
        firsts, edges = visits[index, :count].T.tolist()
        band_bounds = (left if has_left else None, right if has_right else None)
        mine = np.arange(start, start + own)
        blocks_of_other = range(0, 100 + 2 * other, other)
        allowed, unmasked = {}, {}
        for first in blocks_of_other:
            theirs = np.arange(first, first + other)
            rows, columns = (mine, theirs) if keys else (theirs, mine)
            allowed[first] = taking_part(rows, columns, len_q, len_kv, shift, *band_bounds)
            own_padding = (None, len_kv) if keys else (len_q, None)
            unmasked[first] = taking_part(rows, columns, *own_padding, shift, *band_bounds)
        assert len(set(firsts)) == count and all(first % other == 0 for first in firsts), case
        assert {first for first in blocks_of_other if allowed[first].any()} <= set(firsts), case
        interior = {first for first, edge in zip(firsts, edges) if not edge}
        if start >= (len_q if keys else len_kv):
            assert count == 0, case
        else:
            assert interior == {first for first in blocks_of_other if unmasked[first].all()}, case


@triton.jit
def scheduled_blocks_kernel(
    offsets_ptr, blocks_ptr, batch, rows, seq_len, REVERSED: tl.constexpr, RAGGED: tl.constexpr, BLOCK: tl.constexpr
):
    """Program (rank, b): the (batch, first row) scheduled_block gives it, at blocks[b, rank]."""
    rank = tl.program_id(0)
    b, start = scheduled_block(
        rank, tl.program_id(1), offsets_ptr, 1, batch, rows, seq_len, REVERSED, RAGGED, BLOCK, MAX_SEQUENCES
    )
    slot = (tl.program_id(1) * tl.num_programs(0) + rank) * 2
    tl.store(blocks_ptr + slot, b)
    tl.store(blocks_ptr + slot + 1, start)


@pytest.mark.parametrize("reversed_order", [False, True], ids=["launch_order", "reversed"])
@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize(
    "lengths", [[5, 37, 1, 0, 20], [0, 0, 64], [1], [32, 32, 33, 0, 1, 95, 16]], ids=["mixed", "empty", "one", "long"]
)
def test_scheduled_blocks_cover_each_block_once_heaviest_first(lengths, block, reversed_order):
    batch, seq_len = len(lengths), max(lengths)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    needed = {(b, start) for b, length in enumerate(lengths) for start in range(0, length, block)}
    for ragged in (False, True):
        problem = SimpleNamespace(batch=batch, ragged=ragged)
        ranks, rows = triton_tiles.block_grid(problem, 1, int(offsets[-1]), seq_len, block)
        assert ranks <= (triton.cdiv(int(offsets[-1]), block) + batch if ragged else triton.cdiv(seq_len, block))
        blocks = torch.full((rows, ranks, 2), -1, dtype=torch.int32)
        scheduled_blocks_kernel[(ranks, rows)](
            offsets, blocks, batch, int(offsets[-1]), seq_len, reversed_order, ragged, block
        )
        given = [tuple(pair) for pair in blocks.reshape(-1, 2).tolist()]
        real = [(b, start) for b, start in given if start < lengths[b]]
        if ragged:  # the ranks past the real blocks fall past their sequence's end
            assert len(given) - len(real) <= batch and all(0 <= b < batch for b, _ in given)
        else:  # every batch has the longest sequence's blocks; those past its own length are empty
            assert sorted(given) == [(b, start) for b in range(batch) for start in range(0, seq_len, block)]
        assert sorted(real) == sorted(needed)
        for b in range(batch):  # within a sequence: last block first when reversed
            starts = [start for owner, start in real if owner == b]
            assert starts == sorted(starts, reverse=reversed_order)
