"""benchmarks/models.py's language model on the CPU: a small GPT-2 (``benchmarks/gpt2.py``) whose copy has
its attention alone on opendnn, timed against torch's on its SDPA, through ``measure`` and the command line."""

import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import gpt2  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import models  # noqa: E402

# two heads of 64 (the head dim of GPT-2 small), a vocabulary small enough for a fast CPU step
SMALL = functools.partial(gpt2.GPT2, width=128, heads=2, hidden=512, vocabulary=256, positions=16)


def _profiling_timer(profiles: list[set[str]]):
    """A timer that runs the step once, then once profiled (the operators it ran), and says 1 ms."""

    def timer(step):
        step()
        with torch.profiler.profile() as profiler:
            step()
        profiles.append({event.name for event in profiler.events()})
        return 1.0

    return timer


def test_the_gpt2_rows_route_the_attention_alone_to_opendnn():
    profiles: list[set[str]] = []
    subject = models.tokens(functools.partial(SMALL, 2), torch.device("cpu"), 2, 8)
    rows = models.measure("gpt2_small", subject, _profiling_timer(profiles))
    assert [row["mode"] for row in rows] == ["inference", "training"]
    assert all(row["error"] is None and row["ratio"] == 1.0 for row in rows), [row["error"] for row in rows]
    assert all(0 < row["rel_err"] < 2e-2 for row in rows)  # the logits, bf16 autocast on both sides
    expected = ("8 tokens, 2 blocks", "tok/s", 16e3)  # 2 x 8 tokens per 1 ms step
    assert [(row["shape"], row["unit"], row["torch_items_s"]) for row in rows] == [expected] * 2
    torch_inference, our_inference, torch_training, our_training = profiles
    for names in (torch_inference, torch_training):
        assert "aten::scaled_dot_product_attention" in names
        assert not any(name.startswith("opendnn::") for name in names)
    assert {n for n in our_inference if n.startswith("opendnn::")} == {"opendnn::scaled_dot_product_attention"}
    assert {n for n in our_training if n.startswith("opendnn::")} == {
        "opendnn::scaled_dot_product_attention",
        "opendnn::scaled_dot_product_attention_backward",
    }
    assert "aten::scaled_dot_product_attention" not in our_training
    assert {"aten::linear", "aten::layer_norm", "aten::gelu"} <= our_training  # the rest stays torch's


def test_the_command_line_times_gpt2_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setattr(models.gpt2, "GPT2", SMALL)
    monkeypatch.setattr(models, "_cpu_timer", lambda: lambda step: (step(), 2.0)[1])
    argv = ["--models", "gpt2_small", "--device", "cpu", "--batch", "2", "--sequence", "8", "--layers", "1"]
    assert models.main([*argv, "--modes", "training", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "models.md").read_text()
    assert "| gpt2_small | training | 2 | 8 tokens, 1 block | 2.00 | 2.00 | 8,000 tok/s | 8,000 tok/s | 1.00 |" in table
