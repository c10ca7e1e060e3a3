"""benchmarks/api_host.py's calls on the CPU with the kernels stubbed: each call is valid and
reaches its kernels, so the rows it times are the host path of real launches."""

import importlib
from pathlib import Path

from triton.runtime.interpreter import InterpretedFunction

import opendnn as od

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_every_timed_call_launches_its_kernels(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")  # what the script sets: restored after the test
    api_host = importlib.import_module("api_host")
    launched: list[str] = []
    monkeypatch.setattr(InterpretedFunction, "run", lambda self, *args, **kwargs: launched.append(self.fn.__name__))
    handle = od.create("cpu", backend="triton")
    counts = {}
    for name, call in api_host.calls(handle).items():
        before = len(launched)
        call()
        counts[name] = len(launched) - before
    assert set(counts) == {
        "conv_fwd_3x3",
        "conv_bwd_data_3x3",
        "conv_bwd_filter_3x3",
        "conv_fwd_1x1",
        "max_pool_fwd",
        "bn_fwd_training",
        "relu_fwd",
        "adaptive_avg_fwd_10to7",
        "adaptive_avg_bwd_10to7",
        "sdpa_fwd_functional",
        "sdpa_bwd_functional",
    }
    assert all(count >= 1 for count in counts.values()), counts
    assert counts["bn_fwd_training"] == 3, counts  # batch norm's training forward is three launches
    # cells of 2 and 3 positions (10 -> 7): one pooling launch each way, not one per output cell
    assert counts["adaptive_avg_fwd_10to7"] == counts["adaptive_avg_bwd_10to7"] == 1, counts
