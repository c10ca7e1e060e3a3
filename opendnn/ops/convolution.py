"""Convolution (cuDNN's convolution forward, backward data, backward filter): one operation, its
shape and dtype rules, and its NumPy reference.

CONTRACT (written by the lead; the fields of ``ConvolutionProblem`` and the tensor order of
``run()`` are shared by the API/reference helper and the Triton-kernel helper: do not change them
without the lead):

    x: (N, C, *spatial)        activation; dx for BACKWARD_DATA (the output then)
    w: (K, C / groups, *filt)  filter, always described in K, C/g, R, S dim order; KRSC memory
                               order is channels-last strides; dw for BACKWARD_FILTER (the output then)
    y: (N, K, *out)            output of FORWARD; dy for the two backward directions (an input then)

    out[d] = (spatial[d] + pre_padding[d] + post_padding[d] - dilation[d] * (filt[d] - 1) - 1)
             // stride[d] + 1

    FORWARD (cross-correlation, flip=False), per group g of G, k in g's K/G output channels:
        y[n, k, o] = sum_{c in g, r} x[n, c, o * stride - pre_padding + r * dilation] * w[k, c - g*C/G, r]
    flip=True (ConvolutionMode.CONVOLUTION) uses w[k, c, filt - 1 - r] instead of w[k, c, r].
    BACKWARD_DATA is the adjoint in x, BACKWARD_FILTER the adjoint in w, of that same map.

    Backend interface: ``run(problem, x, w, y, bias, z, workspace)`` with ``Bound`` tensors (bias, z
    and workspace may be None); the output is y, x or w by direction, blended as
    ``out = alpha * result + beta * out`` (never read when beta == 0). FORWARD alone has the fused
    epilogue: ``y = act(alpha * conv + alpha2 * z + bias)`` where bias is (1, K, 1, ...) and z has
    y's dims (z may be the very y buffer); with an epilogue, beta must be 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.ops.pointwise import PointwiseMode


class ConvolutionDirection(enum.Enum):
    FORWARD = "forward"
    BACKWARD_DATA = "backward_data"
    BACKWARD_FILTER = "backward_filter"


@dataclass(frozen=True)
class ConvolutionProblem:
    """A validated convolution: every backend receives exactly this.

    Attributes:
        direction: which of x, w, y is the output.
        x, w, y: descriptors as in the module docstring (dims in N/K, C, spatial order, any strides).
        pre_padding, post_padding, stride, dilation: one int per spatial dim.
        groups: G; C and K are multiples of G (depthwise: G == C).
        flip: True for ConvolutionMode.CONVOLUTION (the filter is flipped in every spatial dim).
        compute_type: FLOAT (fp32 accumulation) or DOUBLE.
        allow_tf32: the handle's math type allows TF32 for float32 products.
        algo: the algorithm's enum member (ConvolutionFwdAlgo, ...BwdDataAlgo, ...BwdFilterAlgo).
        alpha, beta: output blending.
        bias: (1, K, 1, ...) descriptor of a fused bias, or None (FORWARD only).
        z: descriptor of the fused residual, y's dims, or None (FORWARD only); alpha2 scales it.
        activation: a PointwiseMode *_FWD activation fused last (FORWARD only), or None;
            activation_coef is its coefficient (clipped relu's ceiling, elu's alpha, swish's beta).
        propagate_nan: the activation's NaN option (relu, clipped relu).
    """

    direction: ConvolutionDirection
    x: TensorDescriptor
    w: TensorDescriptor
    y: TensorDescriptor
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    flip: bool
    compute_type: DataType
    allow_tf32: bool
    algo: enum.Enum
    alpha: float = 1.0
    beta: float = 0.0
    bias: TensorDescriptor | None = None
    z: TensorDescriptor | None = None
    alpha2: float = 0.0
    activation: PointwiseMode | None = None
    activation_coef: float = 0.0
    propagate_nan: bool = False

    @property
    def spatial_dims(self) -> int:
        return self.x.ndim - 2
