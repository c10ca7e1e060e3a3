"""Attention on the GPU (``pytest -m gpu``): the Pythonic API against torch's SDPA on the device (causal bfloat16
with head dims 64 and 128, GQA float16 with head dim 64, bfloat16 with head dim 256, key and value broadcast
over the query's batch), forward and gradients: opendnn's error from the float64 result within 3 times
torch's own. The planned tiles of each head dim run here."""

import pytest
import torch

import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"


def forward_and_gradients(function, q, k, v, do, **kwargs):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = function(*leaves, **kwargs)
    o.backward(do)
    return [o.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize(
    "dtype, shapes, kwargs",
    [
        (torch.bfloat16, ((2, 8, 2048, 128), (2, 8, 2048, 128)), dict(is_causal=True)),
        (torch.float16, ((4, 16, 1024, 64), (4, 4, 1536, 64)), dict(enable_gqa=True)),
        (torch.bfloat16, ((2, 8, 1024, 64), (2, 8, 1024, 64)), dict(is_causal=True)),
        (torch.bfloat16, ((1, 8, 2048, 256), (1, 8, 2048, 256)), dict()),
        (torch.bfloat16, ((2, 8, 1024, 128), (8, 1536, 128)), dict(is_causal=True)),  # key and value broadcast
    ],
)
def test_functional_matches_torch_sdpa_on_gpu(dtype, shapes, kwargs):
    generator = torch.Generator(DEVICE).manual_seed(0)
    q = torch.randn(shapes[0], device=DEVICE, dtype=dtype, generator=generator)
    k, v = (torch.randn(shapes[1], device=DEVICE, dtype=dtype, generator=generator) for _ in range(2))
    do = torch.randn(q.shape, device=DEVICE, dtype=dtype, generator=generator)
    exact = forward_and_gradients(
        torch.nn.functional.scaled_dot_product_attention, q.double(), k.double(), v.double(), do.double(), **kwargs
    )
    theirs = forward_and_gradients(torch.nn.functional.scaled_dot_product_attention, q, k, v, do, **kwargs)
    o, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, **kwargs)
    ours = [o, *F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, **kwargs)]
    for name, mine, torch_result, reference in zip(("o", "dq", "dk", "dv"), ours, theirs, exact):
        assert mine.dtype == dtype and mine.shape == reference.shape, name
        assert relative_error(mine, reference) <= 3 * relative_error(torch_result, reference) + 1e-4, name
