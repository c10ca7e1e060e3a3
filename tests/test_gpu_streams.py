"""One GPU, several handles: convolutions, batch norm and softmax from
several threads, each handle on its own stream, give bitwise the results of a serial run, and two
handles' streams really run side by side."""

import pytest
import torch
from threaded import run_on_own_streams

import opendnn as od
import opendnn.functional as F

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"


def network_step(x: torch.Tensor, w: torch.Tensor, handle: od.Handle) -> list[torch.Tensor]:
    y = F.conv(x, w, padding=1, handle=handle)
    dx = F.conv_backward_data(y, w, x.shape, padding=1, handle=handle)
    dw = F.conv_backward_filter(x, y, w.shape, padding=1, handle=handle)
    z = F.batch_norm(y, training=True, handle=handle)
    return [y, dx, dw, z, F.softmax(z, 1, handle=handle)]


def test_threads_with_own_handles_and_streams_match_serial_bitwise():
    generator = torch.Generator(DEVICE).manual_seed(0)
    inputs = [
        (
            torch.randn(8, 32, 20, 20, device=DEVICE, generator=generator).to(memory_format=torch.channels_last),
            torch.randn(48, 32, 3, 3, device=DEVICE, generator=generator),
        )
        for _ in range(6)
    ]
    serial_handle = od.create(DEVICE)
    expected = [network_step(x, w, serial_handle) for x, w in inputs]
    torch.cuda.synchronize()
    results = run_on_own_streams([DEVICE] * len(inputs), lambda k, handle: network_step(*inputs[k], handle))
    for k, (got, want) in enumerate(zip(results, expected)):
        assert got is not None, f"thread {k} did not finish"
        for a, b in zip(got, want):
            assert torch.equal(a, b), f"thread {k} differs from the serial run"


def test_two_handles_streams_overlap_on_the_gpu():
    """Two independent chains of small convolutions (too small to fill the GPU alone) on two
    handles' streams finish in clearly less time than one after the other. Both streams are held
    by a sleep while the work is enqueued, so the GPU, not the Python launches, sets the pace."""
    x = torch.randn(1, 64, 28, 28, device=DEVICE).to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device=DEVICE)
    handles = [od.create(DEVICE) for _ in range(2)]
    streams = [torch.cuda.Stream(DEVICE) for _ in range(2)]
    for handle, stream in zip(handles, streams):
        handle.set_stream(stream)
    F.conv(x, w, padding=1, handle=handles[0])  # compile first
    torch.cuda.synchronize()

    def elapsed_ms(chains: list[int]) -> float:
        """GPU time from the end of the sleep to the end of every chain; chains[k]: the stream of chain k."""
        start, ends = torch.cuda.Event(enable_timing=True), []
        for k in set(chains):
            with torch.cuda.stream(streams[k]):
                torch.cuda._sleep(300_000_000)  # ~150 ms: longer than enqueueing the 80 launches
        streams[0].wait_stream(streams[1])
        start.record(streams[0])
        streams[1].wait_stream(streams[0])
        for k in chains:
            for _ in range(40):
                F.conv(x, w, padding=1, handle=handles[k])
        for k in set(chains):
            end = torch.cuda.Event(enable_timing=True)
            end.record(streams[k])
            ends.append(end)
        torch.cuda.synchronize()
        return max(start.elapsed_time(end) for end in ends)

    serial = elapsed_ms([0, 0])
    concurrent = elapsed_ms([0, 1])
    print(f"two chains of 40 convolutions: one stream {serial:.3f} ms, two streams {concurrent:.3f} ms")
    assert concurrent < 0.8 * serial
