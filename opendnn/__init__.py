"""opendnn: GPU-accelerated deep-learning primitives, written in Triton, with a NumPy reference.

Two APIs over one dispatch: the cuDNN-shaped calls here (a handle, descriptors, alpha/beta) and
the Pythonic calls in ``opendnn.functional``. Importing opendnn needs NumPy only. Each name is
defined in ``opendnn.core`` or in its family's folder (``opendnn/families/<family>/``: ``problem.py``
and the cuDNN-shaped calls, ``api.py``) and re-exported here by name.
"""

from opendnn._version import __version__, version
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, TensorFormat
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, ExecutionFailed, InternalError, NotSupported, OpenDnnError, Status
from opendnn.core.handle import Handle, MathType, create
from opendnn.families.attention.api import (
    attention_backward,
    attention_forward,
    get_attention_backward_workspace_size,
    get_attention_forward_workspace_size,
)
from opendnn.families.attention.problem import AttentionDescriptor, DiagonalAlignment
from opendnn.families.batch_norm.api import (
    batch_normalization_backward,
    batch_normalization_backward_ex,
    batch_normalization_forward_inference,
    batch_normalization_forward_training,
    batch_normalization_forward_training_ex,
    get_batch_normalization_backward_ex_workspace_size,
    get_batch_normalization_forward_training_ex_workspace_size,
    get_batch_normalization_training_ex_reserve_space_size,
)
from opendnn.families.batch_norm.problem import BatchNormMode, BatchNormOps, derive_bn_tensor_descriptor
from opendnn.families.convolution.algorithms import (
    ConvolutionAlgorithmPerf,
    find_convolution_backward_data_algorithm,
    find_convolution_backward_filter_algorithm,
    find_convolution_forward_algorithm,
    get_convolution_backward_data_algorithm,
    get_convolution_backward_filter_algorithm,
    get_convolution_forward_algorithm,
)
from opendnn.families.convolution.api import (
    convolution_backward_bias,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_bias_activation_forward,
    convolution_forward,
    get_convolution_backward_data_workspace_size,
    get_convolution_backward_filter_workspace_size,
    get_convolution_forward_workspace_size,
)
from opendnn.families.convolution.problem import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    FilterDescriptor,
    get_convolution_forward_output_dim,
)
from opendnn.families.lrn.api import (
    divisive_normalization_backward,
    divisive_normalization_forward,
    lrn_cross_channel_backward,
    lrn_cross_channel_forward,
)
from opendnn.families.lrn.problem import DivNormMode, LRNDescriptor, LRNMode
from opendnn.families.matmul.api import MatmulEpilogue, matmul
from opendnn.families.matmul.problem import BiasAxis
from opendnn.families.normalization.api import (
    normalization_backward,
    normalization_forward_inference,
    normalization_forward_training,
)
from opendnn.families.normalization.problem import NormDescriptor, NormMode
from opendnn.families.pointwise.activation_api import (
    ActivationDescriptor,
    ActivationMode,
    activation_backward,
    activation_forward,
)
from opendnn.families.pointwise.problem import PointwiseMode
from opendnn.families.pointwise.tensor_ops_api import (
    OpTensorDescriptor,
    OpTensorOp,
    add_tensor,
    gen_index,
    op_tensor,
    pointwise,
    scale_tensor,
    set_tensor,
    transform_tensor,
)
from opendnn.families.pooling.api import pooling_backward, pooling_forward
from opendnn.families.pooling.problem import PoolingDescriptor, PoolingMode, get_pooling_forward_output_dim
from opendnn.families.reduce.api import get_reduction_indices_size, get_reduction_workspace_size, reduce_tensor
from opendnn.families.reduce.problem import ReduceTensorDescriptor, ReduceTensorIndices, ReduceTensorOp
from opendnn.families.resample.api import resample_backward, resample_forward
from opendnn.families.resample.problem import InterpolationMode, ResampleDescriptor
from opendnn.families.softmax.api import softmax_backward, softmax_forward
from opendnn.families.softmax.problem import SoftmaxAlgorithm, SoftmaxMode

__all__ = [
    "AttentionDescriptor",
    "DiagonalAlignment",
    "attention_backward",
    "attention_forward",
    "get_attention_backward_workspace_size",
    "get_attention_forward_workspace_size",
    "ActivationDescriptor",
    "ActivationMode",
    "BadParam",
    "BatchNormMode",
    "BatchNormOps",
    "BiasAxis",
    "ConvolutionAlgorithmPerf",
    "ConvolutionBwdDataAlgo",
    "ConvolutionBwdFilterAlgo",
    "ConvolutionDescriptor",
    "ConvolutionFwdAlgo",
    "ConvolutionMode",
    "DataType",
    "ExecutionFailed",
    "DivNormMode",
    "FilterDescriptor",
    "Handle",
    "InternalError",
    "InterpolationMode",
    "LRNDescriptor",
    "LRNMode",
    "MathType",
    "MatmulEpilogue",
    "NanPropagation",
    "NormDescriptor",
    "NormMode",
    "NotSupported",
    "OpTensorDescriptor",
    "OpTensorOp",
    "OpenDnnError",
    "PointwiseMode",
    "PoolingDescriptor",
    "PoolingMode",
    "ReduceTensorDescriptor",
    "ReduceTensorIndices",
    "ReduceTensorOp",
    "ResampleDescriptor",
    "SoftmaxAlgorithm",
    "SoftmaxMode",
    "Status",
    "TensorDescriptor",
    "TensorFormat",
    "__version__",
    "activation_backward",
    "activation_forward",
    "add_tensor",
    "batch_normalization_backward",
    "batch_normalization_backward_ex",
    "batch_normalization_forward_inference",
    "batch_normalization_forward_training",
    "batch_normalization_forward_training_ex",
    "convolution_backward_bias",
    "convolution_backward_data",
    "convolution_backward_filter",
    "convolution_bias_activation_forward",
    "convolution_forward",
    "create",
    "derive_bn_tensor_descriptor",
    "divisive_normalization_backward",
    "divisive_normalization_forward",
    "find_convolution_backward_data_algorithm",
    "find_convolution_backward_filter_algorithm",
    "find_convolution_forward_algorithm",
    "gen_index",
    "get_batch_normalization_backward_ex_workspace_size",
    "get_batch_normalization_forward_training_ex_workspace_size",
    "get_batch_normalization_training_ex_reserve_space_size",
    "get_convolution_backward_data_algorithm",
    "get_convolution_backward_data_workspace_size",
    "get_convolution_backward_filter_algorithm",
    "get_convolution_backward_filter_workspace_size",
    "get_convolution_forward_algorithm",
    "get_convolution_forward_output_dim",
    "get_convolution_forward_workspace_size",
    "get_pooling_forward_output_dim",
    "get_reduction_indices_size",
    "get_reduction_workspace_size",
    "lrn_cross_channel_backward",
    "lrn_cross_channel_forward",
    "matmul",
    "normalization_backward",
    "normalization_forward_inference",
    "normalization_forward_training",
    "op_tensor",
    "pointwise",
    "pooling_backward",
    "pooling_forward",
    "reduce_tensor",
    "scale_tensor",
    "set_tensor",
    "resample_backward",
    "resample_forward",
    "softmax_backward",
    "softmax_forward",
    "transform_tensor",
    "version",
]
