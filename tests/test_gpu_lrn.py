"""GPU tests of cross-channel LRN's kernels (``pytest -m gpu``) beyond the "large" samples: window widths
1..16 (cuDNN's placement), channel counts that no vector or chunk divides (3, 17, 1000), 3-D and 5-D
inputs, NCHW and channels-last, the algorithms of opendnn/families/lrn/triton_backend.py ("stream" with its
channel chunks, and "vector" for channels-last), against float64."""

import pytest
import torch

import opendnn.functional as F
from opendnn.families.lrn import triton_backend as kernels
from opendnn.families.lrn.problem import LRNDescriptor, lrn_backward_reference, lrn_reference

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float64: 1e-10}
ALPHA, BETA, K = 0.5, 0.75, 1.5  # large alpha: the window sum matters (at alpha 1e-4, k dominates)


@pytest.fixture
def algorithm(request):
    """Points every entry of lrn.STREAM ("stream") or lrn.VECTOR ("vector": channels-contiguous layouts only,
    the others take their default) at one algorithm, with changes to its configuration, for one test, then
    restores them."""
    name, changes = request.param
    saved = dict(kernels.STREAM), dict(kernels.VECTOR)
    for key, config in saved[0].items():
        kernels.STREAM[key] = dict(config, **changes) if name == "stream" else config
    for key, config in saved[1].items():
        kernels.VECTOR[key] = dict(config, **changes) if name == "vector" else None
    kernels.lrn_launches.cache_clear()
    yield name
    kernels.STREAM.update(saved[0])
    kernels.VECTOR.update(saved[1])
    kernels.lrn_launches.cache_clear()


def _check(shape, n, dtype, channels_last):
    generator = torch.Generator().manual_seed(n * 1000 + shape[1])
    x = torch.randn(shape, generator=generator, dtype=torch.float64)
    dy = torch.randn(shape, generator=generator, dtype=torch.float64)
    desc = LRNDescriptor(n, ALPHA, BETA, K)
    xd, dyd = (t.to(DEVICE, dtype) for t in (x, dy))
    if channels_last:
        xd, dyd = (
            t.permute(0, *range(2, t.ndim), 1).contiguous().permute(0, t.ndim - 1, *range(1, t.ndim - 1))
            for t in (xd, dyd)
        )
    x64, dy64 = xd.double().cpu().numpy(), dyd.double().cpu().numpy()
    for actual, expected in (
        (F.local_response_norm(xd, n, ALPHA, BETA, K), lrn_reference(x64, desc)),
        (F.local_response_norm_backward(dyd, xd, n, ALPHA, BETA, K), lrn_backward_reference(x64, dy64, desc)),
    ):
        expected = torch.from_numpy(expected)
        error = ((actual.double().cpu() - expected).norm() / expected.norm()).item()
        assert error < TOLERANCE[dtype], f"relative error {error:.3g}"


# lrn_vector_kernel takes channels-contiguous layouts only
@pytest.mark.parametrize(
    "algorithm, channels_last",
    [
        (("stream", {}), False),
        (("stream", {}), True),
        (("stream", {"chunk": 8}), False),
        (("stream", {"chunk": 8}), True),
        (("vector", {}), True),
    ],
    indirect=["algorithm"],
    ids=["stream-nchw", "stream-nhwc", "stream-chunk8-nchw", "stream-chunk8-nhwc", "vector-nhwc"],
)
@pytest.mark.parametrize("n", [1, 2, 5, 10, 16])
@pytest.mark.parametrize("channels", [3, 17, 1000])
def test_lrn_windows_and_channel_counts_on_gpu(algorithm, channels_last, n, channels):
    _check((2, channels, 9, 7), n, torch.float32, channels_last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("shape", [(3, 40, 33), (2, 24, 3, 5, 7)], ids=["3d", "5d"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_lrn_dtypes_and_ranks_on_gpu(dtype, shape, channels_last):
    _check(shape, 5, dtype, channels_last)
