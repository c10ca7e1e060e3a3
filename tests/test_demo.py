"""``opendnn demo``: the digits CNN learns through opendnn's forward and backward passes alone."""

import numpy as np

from opendnn.apps import cli, demo


def test_one_epoch_learns_the_digits_far_beyond_chance():
    history = demo.train(epochs=1, batch_size=64, seed=0, device=demo.Device("cpu"))
    assert history.test_accuracy[0] > 0.8  # chance is 0.1
    assert history.loss[0] < np.log(10)  # below the loss of uniform guesses


def test_network_gradient_matches_finite_differences():
    """The whole backward pass (linear, max pool, relu, batch norm, conv) against a central
    difference of the mean cross-entropy, for a few weights of the first convolution."""
    rng = np.random.default_rng(1)
    device = demo.Device("cpu")
    net = demo.Network(rng, device, batch_size=8)
    images = rng.uniform(0, 1, (8, 1, 8, 8))
    one_hot = np.eye(10)[rng.integers(0, 10, 8)]
    for p in net.parameters():  # float64 end to end, so the difference quotient is exact enough
        p.value = p.value.astype(np.float64)
    for block in net.blocks:
        block.running_mean = block.running_mean.astype(np.float64)
        block.running_var = block.running_var.astype(np.float64)
    net.head.ones = net.head.ones.astype(np.float64)

    def loss() -> float:
        return -float((net.forward(images, training=True) * one_hot).sum()) / 8

    net.backward(net.forward(images, training=True), -one_hot / 8)
    weight = net.blocks[0].weight
    analytic = weight.grad.copy()
    step = 1e-6
    for index in [(0, 0, 0, 0), (3, 0, 1, 2), (15, 0, 2, 1)]:
        saved = weight.value[index]
        weight.value[index] = saved + step
        up = loss()
        weight.value[index] = saved - step
        down = loss()
        weight.value[index] = saved
        assert abs((up - down) / (2 * step) - analytic[index]) < 1e-6 * max(1.0, abs(analytic[index]))


def test_opendnn_demo_writes_the_plot_and_one_line_per_epoch(tmp_path, capsys):
    assert cli.main(["demo", "--epochs", "2", "--batch-size", "128", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "demo_training.png").stat().st_size > 1000
    captured = capsys.readouterr()
    assert "\r" not in captured.err  # not a terminal: no progress bar
    epochs = [line for line in captured.err.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/2", "2/2"]
    assert "test accuracy" in epochs[-1]
    assert f"plot written to {(tmp_path / 'demo_training.png').resolve()}" in captured.out
