"""The Triton kernel of the pooling backward: a gather over cells of the input, each element of dx
written once (the design is in ``triton_backend``'s docstring)."""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.pooling.triton_forward import (
    cell_end,
    cell_start,
    global_window,
    outer_offset,
    program_tile,
    split_constant,
    tile_offset,
    window_counts,
    window_run,
    within,
)


@triton.jit
def holder(o, q, in_size, out_size, ADAPTIVE: tl.constexpr):
    """Along one dim, the window that shift ``q`` takes for cell ``o``: ``o - q``; for an ADAPTIVE dim (a cell
    is one input position) the first output holding the position, ``floor(o * out / size)``, plus q."""
    if ADAPTIVE:
        w = o * out_size // in_size + q
    else:
        w = o - q
    return w


@triton.jit
def holds(w, o, q, in_size, out_size, LAST_SHIFT: tl.constexpr, ADAPTIVE: tl.constexpr):
    """Whether ``holder``'s window ``w`` is an output holding cell ``o``: ``o - q`` is below 0 only when q > 0,
    past the output only when q < cells - outputs (offset -q against LAST_SHIFT); along an ADAPTIVE dim the
    outputs from the first holding position o (q = 0) to ``ceil((o + 1) * out / size) - 1`` do."""
    if ADAPTIVE:
        ok = within(w, ((o + 1) * out_size + in_size - 1) // in_size, q, 0, 1)
    else:
        ok = within(w, out_size, -q, 0, LAST_SHIFT)
    return ok


@triton.jit
def holder_shift(o, b, w, base, ADAPTIVE: tl.constexpr):
    """Windows from the tile's base window to ``w``, cell ``o``'s: ``o - b`` but along ADAPTIVE dims."""
    if ADAPTIVE:
        shift = w - base
    else:
        shift = o - b
    return shift


@triton.jit
def cell_position(o, w, in_size, out_size, LINEAR):
    """Along an ADAPTIVE dim, the position ``o``'s offset in window ``w``'s cell times its weight in the
    row-major window position (``LINEAR``)."""
    return (o - w * in_size // out_size) * LINEAR


@triton.jit
def window_values(
    q,
    b0,
    b1,
    b2,
    o0,
    o1,
    o2,
    o3,
    o4,
    tile_ok,
    dy_ptr,
    argmax_ptr,
    in_sizes,
    out_sizes,
    pads,
    dy_strides,
    argmax_strides,
    WINDOW,
    STRIDE,
    LINEAR,
    CLIPPED: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    SHIFTS: tl.constexpr,
    LAST_SHIFT: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    ARGMAX_LIKE_DY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
    SLICED: tl.constexpr = False,
    slices=1,
):
    """dy of the windows ``o - q`` of the cells ``o`` (0 outside the output; divided by the window's count
    for averages) and, for max, their argmax positions: loaded once, shared by every phase. With ADAPTIVE
    dims, ``adaptive_values``. SLICED: the argmax pass wrote ``slices`` slices of the window one after
    another (a GLOBAL window's), each its first match or the window's size: the least is the window's."""
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    if ADAPTIVE[0] or ADAPTIVE[1] or ADAPTIVE[2] or ADAPTIVE[3] or ADAPTIVE[4]:
        gradient, positions = adaptive_values(
            q0,
            q1,
            q2,
            q3,
            q4,
            b0,
            b1,
            b2,
            o0,
            o1,
            o2,
            o3,
            o4,
            tile_ok,
            dy_ptr,
            argmax_ptr,
            in_sizes,
            out_sizes,
            pads,
            dy_strides,
            argmax_strides,
            WINDOW,
            STRIDE,
            LINEAR,
            CLIPPED,
            ADAPTIVE,
            LAST_SHIFT,
            KIND,
            INCLUDE_PADDING,
            ARGMAX_LIKE_DY,
            WIDE,
            COMPUTE,
        )
    else:  # (the helpers' debug labels alone moved ptxas's register allocation: none here)
        w0, w1, w2, w3, w4 = o0 - q0, o1 - q1, o2 - q2, o3 - q3, o4 - q4
        # o - q < 0 only when q > 0; past the output only when q < cells - outputs (offset -q against LAST_SHIFT)
        w_row = (
            within(w3, out_sizes[3], -q3, 0, LAST_SHIFT[3])
            & within(w0, out_sizes[0], -q0, 0, LAST_SHIFT[0])
            & within(w1, out_sizes[1], -q1, 0, LAST_SHIFT[1])
            & within(w2, out_sizes[2], -q2, 0, LAST_SHIFT[2])
        )
        ok = tile_ok & w_row[None, :] & within(w4, out_sizes[4], -q4, 0, LAST_SHIFT[4])[:, None]
        dy_at = (
            dy_ptr
            + outer_offset(b0 - q0, b1 - q1, b2 - q2, dy_strides)
            + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, dy_strides, WIDE)
        )
        gradient = tl.load(dy_at, mask=ok, other=0.0).to(COMPUTE)
        if KIND == "max":
            if ARGMAX_LIKE_DY:  # the same offsets as dy's, computed once
                argmax_strides = dy_strides
            argmax_at = (
                argmax_ptr
                + outer_offset(b0 - q0, b1 - q1, b2 - q2, argmax_strides)
                + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, argmax_strides, WIDE)
            )
            positions = tl.load(argmax_at, mask=ok, other=-1).to(tl.int32)
            if SLICED:
                size = out_sizes[0] * out_sizes[1] * out_sizes[2] * out_sizes[3] * out_sizes[4]
                for split in range(1, slices):
                    later = tl.load(argmax_at + split * size, mask=ok, other=-1).to(tl.int32)
                    positions = tl.minimum(positions, later)
        else:
            counts = window_counts(
                w0 * STRIDE[0] - pads[0],
                w1 * STRIDE[1] - pads[1],
                w2 * STRIDE[2] - pads[2],
                w3 * STRIDE[3] - pads[3],
                w4 * STRIDE[4] - pads[4],
                in_sizes[0],
                in_sizes[1],
                in_sizes[2],
                in_sizes[3],
                in_sizes[4],
                in_sizes,
                pads,
                WINDOW,
                CLIPPED,
                ADAPTIVE,
                INCLUDE_PADDING,
            )
            gradient = gradient / counts.to(COMPUTE)
            positions = ok.to(tl.int32)  # not read by averages
    return gradient, positions


@triton.jit
def adaptive_values(
    q0,
    q1,
    q2,
    q3,
    q4,
    b0,
    b1,
    b2,
    o0,
    o1,
    o2,
    o3,
    o4,
    tile_ok,
    dy_ptr,
    argmax_ptr,
    in_sizes,
    out_sizes,
    pads,
    dy_strides,
    argmax_strides,
    WINDOW,
    STRIDE,
    LINEAR,
    CLIPPED: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    LAST_SHIFT: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    ARGMAX_LIKE_DY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """``window_values`` where some dims are ADAPTIVE: there the window is the q-th output holding the cell
    (``holder``, ``holds``), and the cell's offset in it, per element, is taken off the argmax position
    (``window_share`` matches the rest); the averages count the windows' cells."""
    w0 = holder(o0, q0, in_sizes[0], out_sizes[0], ADAPTIVE[0])
    w1 = holder(o1, q1, in_sizes[1], out_sizes[1], ADAPTIVE[1])
    w2 = holder(o2, q2, in_sizes[2], out_sizes[2], ADAPTIVE[2])
    w3 = holder(o3, q3, in_sizes[3], out_sizes[3], ADAPTIVE[3])
    w4 = holder(o4, q4, in_sizes[4], out_sizes[4], ADAPTIVE[4])
    w_row = (
        holds(w3, o3, q3, in_sizes[3], out_sizes[3], LAST_SHIFT[3], ADAPTIVE[3])
        & holds(w0, o0, q0, in_sizes[0], out_sizes[0], LAST_SHIFT[0], ADAPTIVE[0])
        & holds(w1, o1, q1, in_sizes[1], out_sizes[1], LAST_SHIFT[1], ADAPTIVE[1])
        & holds(w2, o2, q2, in_sizes[2], out_sizes[2], LAST_SHIFT[2], ADAPTIVE[2])
    )
    ok = tile_ok & w_row[None, :] & holds(w4, o4, q4, in_sizes[4], out_sizes[4], LAST_SHIFT[4], ADAPTIVE[4])[:, None]
    base0 = holder(b0, q0, in_sizes[0], out_sizes[0], ADAPTIVE[0])
    base1 = holder(b1, q1, in_sizes[1], out_sizes[1], ADAPTIVE[1])
    base2 = holder(b2, q2, in_sizes[2], out_sizes[2], ADAPTIVE[2])
    shift0 = holder_shift(o0, b0, w0, base0, ADAPTIVE[0])
    shift1 = holder_shift(o1, b1, w1, base1, ADAPTIVE[1])
    shift2 = holder_shift(o2, b2, w2, base2, ADAPTIVE[2])
    dy_at = (
        dy_ptr
        + outer_offset(base0, base1, base2, dy_strides)
        + tile_offset(shift0, shift1, shift2, w3, w4, dy_strides, WIDE)
    )
    gradient = tl.load(dy_at, mask=ok, other=0.0).to(COMPUTE)
    if KIND == "max":
        if ARGMAX_LIKE_DY:  # the same offsets as dy's, computed once
            argmax_strides = dy_strides
        argmax_at = (
            argmax_ptr
            + outer_offset(base0, base1, base2, argmax_strides)
            + tile_offset(shift0, shift1, shift2, w3, w4, argmax_strides, WIDE)
        )
        positions = tl.load(argmax_at, mask=ok, other=-1).to(tl.int32)
        # the cell's offsets along the adaptive dims (masked windows: -1 less them, which matches nothing)
        rows = tl.zeros_like(o3)
        if ADAPTIVE[0]:
            rows += cell_position(o0, w0, in_sizes[0], out_sizes[0], LINEAR[0])
        if ADAPTIVE[1]:
            rows += cell_position(o1, w1, in_sizes[1], out_sizes[1], LINEAR[1])
        if ADAPTIVE[2]:
            rows += cell_position(o2, w2, in_sizes[2], out_sizes[2], LINEAR[2])
        if ADAPTIVE[3]:
            rows += cell_position(o3, w3, in_sizes[3], out_sizes[3], LINEAR[3])
        columns = tl.zeros_like(o4)
        if ADAPTIVE[4]:
            columns += cell_position(o4, w4, in_sizes[4], out_sizes[4], LINEAR[4])
        positions -= rows[None, :] + columns[:, None]
    else:
        counts = window_counts(
            cell_start(w0, in_sizes[0], out_sizes[0], STRIDE[0], pads[0], ADAPTIVE[0]),
            cell_start(w1, in_sizes[1], out_sizes[1], STRIDE[1], pads[1], ADAPTIVE[1]),
            cell_start(w2, in_sizes[2], out_sizes[2], STRIDE[2], pads[2], ADAPTIVE[2]),
            cell_start(w3, in_sizes[3], out_sizes[3], STRIDE[3], pads[3], ADAPTIVE[3]),
            cell_start(w4, in_sizes[4], out_sizes[4], STRIDE[4], pads[4], ADAPTIVE[4]),
            cell_end(w0, in_sizes[0], out_sizes[0], ADAPTIVE[0]),
            cell_end(w1, in_sizes[1], out_sizes[1], ADAPTIVE[1]),
            cell_end(w2, in_sizes[2], out_sizes[2], ADAPTIVE[2]),
            cell_end(w3, in_sizes[3], out_sizes[3], ADAPTIVE[3]),
            cell_end(w4, in_sizes[4], out_sizes[4], ADAPTIVE[4]),
            in_sizes,
            pads,
            WINDOW,
            CLIPPED,
            ADAPTIVE,
            INCLUDE_PADDING,
        )
        gradient = gradient / counts.to(COMPUTE)
        positions = ok.to(tl.int32)  # not read by averages
    return gradient, positions


@triton.jit
def window_share(
    gradient,
    positions,
    phase,
    q,
    WINDOW,
    STRIDE,
    SHIFTS: tl.constexpr,
    LINEAR,
    DILATION: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    KIND: tl.constexpr,
):
    """What window ``o - q`` sends to the input position ``r + q * stride`` past its start (``r`` the
    phase): its dy where that position is its argmax (max) or its dy / count; 0 where no window offset
    lands there (past the window's end, or between the offsets of a dilated window)."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    i0, i1, i2, i3, i4 = (
        r0 + q0 * STRIDE[0],
        r1 + q1 * STRIDE[1],
        r2 + q2 * STRIDE[2],
        r3 + q3 * STRIDE[3],
        r4 + q4 * STRIDE[4],
    )
    # along an ADAPTIVE dim the position's offset in its window is per element (window_values took it off the
    # argmax): 0 here, inside every window
    if ADAPTIVE[0]:
        i0 = 0
    if ADAPTIVE[1]:
        i1 = 0
    if ADAPTIVE[2]:
        i2 = 0
    if ADAPTIVE[3]:
        i3 = 0
    if ADAPTIVE[4]:
        i4 = 0
    j0, j1, j2, j3, j4 = i0 // DILATION[0], i1 // DILATION[1], i2 // DILATION[2], i3 // DILATION[3], i4 // DILATION[4]
    in_window = (j0 < WINDOW[0]) & (j1 < WINDOW[1]) & (j2 < WINDOW[2]) & (j3 < WINDOW[3]) & (j4 < WINDOW[4])
    on_offsets = (
        (i0 % DILATION[0] == 0)
        & (i1 % DILATION[1] == 0)
        & (i2 % DILATION[2] == 0)
        & (i3 % DILATION[3] == 0)
        & (i4 % DILATION[4] == 0)
    )
    in_window = in_window & on_offsets
    if KIND == "max":
        linear = j0 * LINEAR[0] + j1 * LINEAR[1] + j2 * LINEAR[2] + j3 * LINEAR[3] + j4 * LINEAR[4]
        share = tl.where(in_window & (positions == linear), gradient, 0.0)
    else:
        share = tl.where(in_window, gradient, 0.0)
    return share


@triton.jit
def store_phase(
    total,
    phase,
    b0,
    b1,
    b2,
    o0,
    o1,
    o2,
    o3,
    o4,
    row_ok,
    col_ok,
    dx_ptr,
    in_sizes,
    pads,
    dx_strides,
    alpha,
    beta,
    STRIDE,
    LOW: tl.constexpr,
    HIGH,
    HAS_BETA: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """dx = alpha * total + beta * dx at the input positions ``o * stride - padding + r`` of the cells
    ``o`` (``r`` the phase) that lie inside x: tested before its start for phases under the padding
    (LOW), past its end for phases from HIGH (the last cell's)."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    i0 = o0 * STRIDE[0] - pads[0] + r0
    i1 = o1 * STRIDE[1] - pads[1] + r1
    i2 = o2 * STRIDE[2] - pads[2] + r2
    i3 = o3 * STRIDE[3] - pads[3] + r3
    i4 = o4 * STRIDE[4] - pads[4] + r4
    in_row = (
        row_ok
        & within(i3, in_sizes[3], r3, LOW[3], HIGH[3])
        & within(i0, in_sizes[0], r0, LOW[0], HIGH[0])
        & within(i1, in_sizes[1], r1, LOW[1], HIGH[1])
        & within(i2, in_sizes[2], r2, LOW[2], HIGH[2])
    )
    in_ok = in_row[None, :] & (col_ok & within(i4, in_sizes[4], r4, LOW[4], HIGH[4]))[:, None]
    dx_at = (
        dx_ptr
        + outer_offset(
            b0 * STRIDE[0] - pads[0] + r0, b1 * STRIDE[1] - pads[1] + r1, b2 * STRIDE[2] - pads[2] + r2, dx_strides
        )
        + tile_offset((o0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], i3, i4, dx_strides, WIDE)
    )
    result = total * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        result += tl.cast(beta, COMPUTE) * tl.load(dx_at, mask=in_ok).to(COMPUTE)
    tl.store(dx_at, result.to(dx_ptr.dtype.element_ty), mask=in_ok)


@triton.jit
def pool_backward_kernel(
    dy_ptr,
    argmax_ptr,
    dx_ptr,
    in_sizes,
    out_sizes,
    cell_sizes,
    pads,
    dy_strides,
    argmax_strides,
    dx_strides,
    alpha: tl.float64,
    beta: tl.float64,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    CLIPPED: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    SHIFTS: tl.constexpr,
    LAST_SHIFT: tl.constexpr,
    LINEAR: tl.constexpr,
    DILATION: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    HAS_BETA: tl.constexpr,
    UNROLL: tl.constexpr,
    GLOBAL: tl.constexpr,
    ARGMAX_LIKE_DY: tl.constexpr,
    CARRY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program: BLOCK_R rows x BLOCK_C columns of cells (held as BLOCK_C x BLOCK_R); writes dx at every
    input position of those cells. UNROLL: window by window (each window's dy and argmax loaded once,
    one sum per phase, the stores last); else phase by phase, every window loaded per phase (from L1 after
    the first). GLOBAL (a window is the whole input along the dims it pools, so a cell is one window;
    WINDOW, STRIDE, HIGH and LINEAR None): the phases are its positions, counted at run time. ADAPTIVE dims
    (torch's adaptive cells: stride 1, so a cell is one input position): the windows are the SHIFTS outputs
    from the first holding the position (``holder``). A GLOBAL max: the window's dy and argmax (the least of
    the argmax pass's slices, as many as grid axis 1 has programs) are loaded once, and grid axis 1 cuts the
    phases into as many runs, one a program."""
    b0, b1, b2, o0, o1, o2, o3, o4 = program_tile(cell_sizes, BLOCK_R, BLOCK_C, CARRY)
    row_ok = o0 < cell_sizes[0]
    col_ok = o4 < cell_sizes[4]
    tile_ok = row_ok[None, :] & col_ok[:, None]
    shifts: tl.constexpr = SHIFTS[0] * SHIFTS[1] * SHIFTS[2] * SHIFTS[3] * SHIFTS[4]
    if not GLOBAL:  # the window's shape as constants
        window: tl.constexpr = WINDOW
        stride: tl.constexpr = STRIDE
        high: tl.constexpr = HIGH
        linear: tl.constexpr = LINEAR
        phases: tl.constexpr = STRIDE[0] * STRIDE[1] * STRIDE[2] * STRIDE[3] * STRIDE[4]
    else:  # a cell is one window (its output): its positions are the phases, its end the input's
        window, linear, phases = global_window(in_sizes, cell_sizes)
        stride, high = window, window
    if UNROLL:
        totals = ()
        for _ in tl.static_range(phases):
            totals = totals + (tl.zeros((BLOCK_C, BLOCK_R), COMPUTE),)
        for q in tl.static_range(shifts):
            gradient, positions = window_values(
                q,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                tile_ok,
                dy_ptr,
                argmax_ptr,
                in_sizes,
                out_sizes,
                pads,
                dy_strides,
                argmax_strides,
                WINDOW,
                STRIDE,
                LINEAR,
                CLIPPED,
                ADAPTIVE,
                SHIFTS,
                LAST_SHIFT,
                KIND,
                INCLUDE_PADDING,
                ARGMAX_LIKE_DY,
                WIDE,
                COMPUTE,
            )
            summed = ()
            for phase in tl.static_range(phases):
                summed = summed + (
                    totals[phase]
                    + window_share(
                        gradient, positions, phase, q, WINDOW, STRIDE, SHIFTS, LINEAR, DILATION, ADAPTIVE, KIND
                    ),
                )
            totals = summed
        for phase in tl.static_range(phases):
            store_phase(
                totals[phase],
                phase,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                row_ok,
                col_ok,
                dx_ptr,
                in_sizes,
                pads,
                dx_strides,
                alpha,
                beta,
                STRIDE,
                LOW,
                HIGH,
                HAS_BETA,
                WIDE,
                COMPUTE,
            )
    elif GLOBAL and KIND == "max":  # one window a cell, its dy and argmax loaded once; a run of its phases
        gradient, positions = window_values(
            0,
            b0,
            b1,
            b2,
            o0,
            o1,
            o2,
            o3,
            o4,
            tile_ok,
            dy_ptr,
            argmax_ptr,
            in_sizes,
            out_sizes,
            pads,
            dy_strides,
            argmax_strides,
            window,
            stride,
            linear,
            CLIPPED,
            ADAPTIVE,
            SHIFTS,
            LAST_SHIFT,
            KIND,
            INCLUDE_PADDING,
            ARGMAX_LIKE_DY,
            WIDE,
            COMPUTE,
            True,
            tl.num_programs(1),
        )
        start, end = window_run(phases, 1)
        for phase in range(start, end):
            store_phase(
                window_share(gradient, positions, phase, 0, window, stride, SHIFTS, linear, DILATION, ADAPTIVE, KIND),
                phase,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                row_ok,
                col_ok,
                dx_ptr,
                in_sizes,
                pads,
                dx_strides,
                alpha,
                beta,
                stride,
                LOW,
                high,
                HAS_BETA,
                WIDE,
                COMPUTE,
            )
    else:
        for phase in range(phases):
            total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
            for q in range(shifts):
                gradient, positions = window_values(
                    q,
                    b0,
                    b1,
                    b2,
                    o0,
                    o1,
                    o2,
                    o3,
                    o4,
                    tile_ok,
                    dy_ptr,
                    argmax_ptr,
                    in_sizes,
                    out_sizes,
                    pads,
                    dy_strides,
                    argmax_strides,
                    window,
                    stride,
                    linear,
                    CLIPPED,
                    ADAPTIVE,
                    SHIFTS,
                    LAST_SHIFT,
                    KIND,
                    INCLUDE_PADDING,
                    ARGMAX_LIKE_DY,
                    WIDE,
                    COMPUTE,
                )
                total += window_share(
                    gradient, positions, phase, q, window, stride, SHIFTS, linear, DILATION, ADAPTIVE, KIND
                )
            store_phase(
                total,
                phase,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                row_ok,
                col_ok,
                dx_ptr,
                in_sizes,
                pads,
                dx_strides,
                alpha,
                beta,
                stride,
                LOW,
                high,
                HAS_BETA,
                WIDE,
                COMPUTE,
            )
