"""opendnn: GPU-accelerated deep-learning primitives, written in Triton, with a NumPy reference.

Two APIs over one dispatch: the cuDNN-shaped calls here (a handle, descriptors, alpha/beta) and
the Pythonic calls in ``opendnn.functional``. Importing opendnn needs NumPy only.
"""

from opendnn._version import __version__, version
from opendnn.api.activation import (
    ActivationDescriptor,
    ActivationMode,
    activation_backward,
    activation_forward,
)
from opendnn.api.reduce import get_reduction_indices_size, get_reduction_workspace_size, reduce_tensor
from opendnn.api.tensor_ops import (
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
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, TensorFormat
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, ExecutionFailed, InternalError, NotSupported, OpenDnnError, Status
from opendnn.core.handle import Handle, MathType, create
from opendnn.ops.pointwise import PointwiseMode
from opendnn.ops.reduce import ReduceTensorDescriptor, ReduceTensorIndices, ReduceTensorOp

__all__ = [
    "ActivationDescriptor",
    "ActivationMode",
    "BadParam",
    "DataType",
    "ExecutionFailed",
    "Handle",
    "InternalError",
    "MathType",
    "NanPropagation",
    "NotSupported",
    "OpTensorDescriptor",
    "OpTensorOp",
    "OpenDnnError",
    "PointwiseMode",
    "ReduceTensorDescriptor",
    "ReduceTensorIndices",
    "ReduceTensorOp",
    "Status",
    "TensorDescriptor",
    "TensorFormat",
    "__version__",
    "activation_backward",
    "activation_forward",
    "add_tensor",
    "create",
    "gen_index",
    "get_reduction_indices_size",
    "get_reduction_workspace_size",
    "op_tensor",
    "pointwise",
    "reduce_tensor",
    "scale_tensor",
    "set_tensor",
    "transform_tensor",
    "version",
]
