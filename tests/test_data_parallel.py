"""Data-parallel training on opendnn, on the CPU: two gloo processes under
DistributedDataParallel with the converted digits model."""

import sys

import pytest
import torch

from opendnn.apps import data_parallel as dp

WORLD_SIZE = 2
BATCH = 32  # per rank
TIMEOUT_S = 60


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.double() - theirs.double()).norm() / theirs.double().norm()).item()


def assert_same_step(ours: dict, theirs: dict) -> None:
    for kind in ("gradients", "parameters"):
        assert ours[kind].keys() == theirs[kind].keys()
        for name, value in ours[kind].items():
            error = relative_error(value, theirs[kind][name])
            assert error < 1e-6, f"{kind} {name}: relative error {error:.2e}"


@pytest.fixture(scope="module")
def ddp_steps() -> dict[bool, list[dict]]:
    """One DDP step per rank, batch norm live (per-rank statistics) and frozen (eval mode)."""
    ranks = dp.launch(dp.one_step, WORLD_SIZE, TIMEOUT_S, batch_size=BATCH, seed=0)
    return {frozen: [rank[frozen] for rank in ranks] for frozen in (False, True)}


@pytest.mark.parametrize("frozen", [False, True], ids=["batch_norm_per_rank", "batch_norm_frozen"])
def test_ddp_step_leaves_every_rank_with_the_same_parameters(ddp_steps, frozen):
    first, second = ddp_steps[frozen]
    for name, value in first["parameters"].items():
        assert torch.equal(value, second["parameters"][name]), name
    torch.manual_seed(0)  # one_step's seed: the initial weights
    initial = dict(dp.digits_model().named_parameters())
    assert any(not torch.equal(first["parameters"][n], initial[n]) for n in initial)  # the step moved them


def test_ddp_step_equals_averaging_each_ranks_gradient_by_hand(ddp_steps):
    """Batch norm live: each rank normalizes with its own batch's statistics, so DDP equals one
    process running each rank's batch separately and averaging the gradients."""
    expected = dp.reference_step(WORLD_SIZE, batch_size=BATCH, seed=0, freeze_batch_norm=False, union=False)
    assert_same_step(ddp_steps[False][0], expected)


def test_ddp_step_with_frozen_batch_norm_equals_one_step_on_the_union_batch(ddp_steps):
    """Batch norm frozen (running statistics): a rank's gradient no longer depends on its batch
    mates, so DDP equals one backward over both ranks' batches together."""
    expected = dp.reference_step(WORLD_SIZE, batch_size=BATCH, seed=0, freeze_batch_norm=True, union=True)
    assert_same_step(ddp_steps[True][0], expected)


def test_two_ranks_train_the_digits_to_over_80_percent_in_one_epoch():
    results = dp.launch(
        dp.train, WORLD_SIZE, TIMEOUT_S, backend="gloo", device="cpu", epochs=1, batch_size=BATCH, seed=0
    )
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["test_accuracy"] > 0.8
    assert results[1]["test_accuracy"] is None
    assert results[0]["images"] == 2 * len(dp.rank_loader(dp.digits(0)[0], 0, WORLD_SIZE, BATCH, 0).sampler)
    assert results[0]["images_per_second"] > 0


def test_resnet50_without_torchvision_says_torchvision_is_needed(monkeypatch):
    """None in sys.modules makes the import fail whether torchvision is installed or not."""
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    with pytest.raises(ImportError, match="--model resnet50 needs torchvision"):
        dp.resnet50_model()
    with pytest.raises(ImportError, match="--model resnet50 needs torchvision"):  # before spawning any rank
        dp.main(["--model", "resnet50", "--device", "cpu", "--world-size", "1"])
