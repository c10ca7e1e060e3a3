"""1x1 convolutions that are plain matrix products: a stride-1 ungrouped forward or backward data is
one product on matmul's kernels (``matmul_form``), the pixels by the filter over channels-last
pixels, the filter by each image over images that store their pixels contiguously (NCHW, 16-bit:
``filter_times_images``); a backward filter over such images is one product per image
(``filter_matmul_form``)."""

from __future__ import annotations

import functools

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.convolution.problem import ConvolutionMethod, ConvolutionProblem, method_of
from opendnn.families.convolution.triton_tiles import BACKWARD_DATA, BACKWARD_FILTER, geometry, tf32
from opendnn.families.matmul.problem import BiasAxis, MatmulProblem, matmul_problem
from opendnn.kernels.device import TMA_ALIGNMENT


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def matmul_form(problem: ConvolutionProblem) -> MatmulProblem | None:
    """The matrix product a 1x1 problem is, or None. Forward: y[P, K] = x[P, C] @ w[K, C]^T (+ bias);
    backward data: dx[P, C] = dy[P, K] @ w[K, C]; P = N x pixels. Taken when no padding, stride or
    group changes that, when the pixels of x and y each step by one stride and their channels are
    contiguous (channels-last: TMA reads the rows), for 16-bit and TF32 products (matmul runs strict
    float32 and float64 on FMA units, the GEMM kernel on tensor cores), and when matmul's epilogue
    computes the same thing: no residual z or activation, and alpha 1 with a bias (matmul scales the
    biased sum, convolution only the product). Over images that hold their pixels contiguous (NCHW)
    a 16-bit problem is the product of the filter by each image instead (``filter_times_images``)."""
    geo = geometry(problem)
    if (
        problem.direction is BACKWARD_FILTER
        or not pixelwise(problem)
        or geo.groups != 1
        or method_of(problem.algo) is ConvolutionMethod.DIRECT
        or problem.z is not None
        or problem.activation is not None
        or (problem.bias is not None and problem.alpha != 1.0)
    ):
        return None
    dtype = problem.x.dtype
    if not (dtype.itemsize == 2 or (dtype is DataType.FLOAT and problem.allow_tf32)):
        return None
    if filter_times_images(problem):
        return _images_form(problem)
    a, c = (problem.y, problem.x) if problem.direction is BACKWARD_DATA else (problem.x, problem.y)
    a_pixels, c_pixels = pixel_stride(a), pixel_stride(c)
    if a_pixels is None or c_pixels is None or a.strides[1] != 1 or c.strides[1] != 1:
        return None
    w_k, w_c = problem.w.strides[:2]
    rows = geo.output_pixels
    b = (
        TensorDescriptor(dtype, (geo.k, geo.c), (w_k, w_c))
        if problem.direction is BACKWARD_DATA
        else TensorDescriptor(dtype, (geo.c, geo.k), (w_c, w_k))
    )
    bias = None if problem.bias is None else TensorDescriptor(problem.bias.dtype, (geo.k,), (problem.bias.strides[1],))
    return matmul_problem(
        TensorDescriptor(dtype, (rows, a.dims[1]), (a_pixels, 1)),
        b,
        TensorDescriptor(dtype, (rows, c.dims[1]), (c_pixels, 1)),
        alpha=problem.alpha,
        beta=problem.beta,
        bias_desc=bias,
        allow_tf32=problem.allow_tf32,
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run of the matrix form
def filter_times_images(problem: ConvolutionProblem) -> bool:
    """Whether the matrix form of a 1x1 forward or backward data multiplies the filter by each image:
    y[n] (K x P) = w (K x C) @ x[n] (C x P), dx[n] (C x P) = w^T (C x K) @ dy[n] (K x P), where x and y
    hold each image's pixels contiguous and their channels apart (NCHW), in a 16-bit type (wgmma
    reads its B, the image, pixels-major; TF32 would need a copy of it), where TMA reads the images:
    their channels (rows) 16 bytes apart. Read by pointers, the product ran slower than the implicit
    GEMM it replaces (H100, ResNet-50's 1x1 layer at 14 x 14, 392-byte rows, batch 64: 0.076 of a ms
    against 0.047 forward)."""
    a, c = (problem.y, problem.x) if problem.direction is BACKWARD_DATA else (problem.x, problem.y)
    itemsize = problem.x.dtype.itemsize
    return (
        itemsize == 2
        and pixels_contiguous(a)
        and pixels_contiguous(c)
        and geometry(problem).output_pixels // geometry(problem).n > 1
        and (a.strides[1] != 1 or c.strides[1] != 1)
        and all(stride * itemsize % TMA_ALIGNMENT == 0 for stride in (*a.strides[:2], *c.strides[:2]))
    )


def _images_form(problem: ConvolutionProblem) -> MatmulProblem:
    """``matmul_form``'s product of the filter by each image (``filter_times_images``); the filter's batch
    dim broadcast, a bias one value a row."""
    geo = geometry(problem)
    dtype, pixels = problem.x.dtype, geo.output_pixels // geo.n
    w_k, w_c = problem.w.strides[:2]
    backward = problem.direction is BACKWARD_DATA
    a, c = (problem.y, problem.x) if backward else (problem.x, problem.y)
    w = (
        TensorDescriptor(dtype, (geo.c, geo.k), (w_c, w_k))
        if backward
        else TensorDescriptor(dtype, (geo.k, geo.c), (w_k, w_c))
    )
    bias = None if problem.bias is None else TensorDescriptor(problem.bias.dtype, (geo.k,), (problem.bias.strides[1],))
    return matmul_problem(
        w,
        TensorDescriptor(dtype, (geo.n, a.dims[1], pixels), (*a.strides[:2], 1)),
        TensorDescriptor(dtype, (geo.n, c.dims[1], pixels), (*c.strides[:2], 1)),
        alpha=problem.alpha,
        beta=problem.beta,
        bias_desc=bias,
        bias_axis=BiasAxis.ROW,
        allow_tf32=problem.allow_tf32,
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def filter_matmul_form(problem: ConvolutionProblem) -> MatmulProblem | None:
    """Backward filter of a 1x1 problem whose images store their pixels contiguously (NCHW) as one
    batched product: partial[n] = dy[n] (K x P) @ x[n]^T (P x C), both operands read with the pixels,
    the reduced dim, contiguous (what TF32 tensor cores need); ``filter_sum_kernel`` then adds the N
    partials in order. Taken for 16-bit and TF32 products under IMPLICIT_GEMM when the N partial
    filters take no more memory than an explicit GEMM's columns (K <= pixels per image), for two
    images or more."""
    geo = geometry(problem)
    pixels = geo.output_pixels // geo.n
    dtype = problem.x.dtype
    if (
        problem.direction is not BACKWARD_FILTER
        or not pixelwise(problem)
        or geo.groups != 1
        or geo.k > pixels
        or geo.n == 1
        or method_of(problem.algo) is not ConvolutionMethod.IMPLICIT_GEMM
        or not (dtype.itemsize == 2 or tf32(problem))
    ):
        return None
    if not (pixels_contiguous(problem.x) and pixels_contiguous(problem.y)):
        return None
    (x_sn, x_sc), (dy_sn, dy_sk) = problem.x.strides[:2], problem.y.strides[:2]
    return matmul_problem(
        TensorDescriptor(dtype, (geo.n, geo.k, pixels), (dy_sn, dy_sk, 1)),
        TensorDescriptor(dtype, (geo.n, pixels, geo.c), (x_sn, 1, x_sc)),
        TensorDescriptor(DataType.FLOAT, (geo.n, geo.k, geo.c)),
        allow_tf32=problem.allow_tf32,
    )


def pixel_stride(desc: TensorDescriptor) -> int | None:
    """The one stride that steps through every pixel (n, then spatial dims) in order, or None when
    the pixels are not evenly spaced."""
    pixel_dims = [(d, s) for d, s in zip((desc.dims[0], *desc.dims[2:]), (desc.strides[0], *desc.strides[2:])) if d > 1]
    if not pixel_dims:
        return 1
    stride = pixel_dims[-1][1]
    for (_, outer), (size, inner) in zip(pixel_dims, pixel_dims[1:]):
        if outer != inner * size:
            return None
    return stride


def pixelwise(problem: ConvolutionProblem) -> bool:
    """One tap at stride 1 without padding: output pixel q meets input pixel q alone."""
    return (
        geometry(problem).taps == 1
        and all(s == 1 for s in problem.stride)
        and not any(problem.pre_padding)
        and not any(problem.post_padding)
    )


def pixels_contiguous(desc: TensorDescriptor) -> bool:
    """Whether each image (sample) of ``desc`` holds its pixels contiguous, one element apart."""
    return pixel_stride(TensorDescriptor(desc.dtype, (1, *desc.dims[1:]), desc.strides)) == 1


def matrix_bound(bound: Bound, desc: TensorDescriptor | None) -> Bound:
    """``bound``'s memory seen through the matrix descriptor ``desc`` (same first element)."""
    if desc is None:  # (a matrix form describes every tensor its problem has)
        raise InternalError(f"convolution's matrix form has no descriptor for {bound.name}")
    return Bound(bound.name, desc, torch_view(bound).as_strided(desc.dims, desc.strides), bound.device)
