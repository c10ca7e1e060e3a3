"""opendnn's graph API, named as cudnn-frontend's Python ``pygraph``: describe a small graph of
operations on graph tensors and virtual intermediates, validate it, let the engines plan it
(fusing pointwise chains, reductions and convolution / matmul epilogues into generated Triton
kernels), build the plans once and execute them many times with a variant pack of arrays.

    import opendnn.graph as og

    g = og.Graph(io_data_type=og.DataType.HALF, intermediate_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[8, 64, 56, 56], stride=[200704, 1, 3584, 64], name="x")   # NHWC in memory
    w = g.tensor(dim=[64, 64, 3, 3], name="w")
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    y = g.relu(g.bias(g.conv_fprop(x, w, padding=[1, 1]), b))
    y.set_output(True)
    g.validate(); g.build_operation_graph(); g.create_execution_plans([og.HeurMode.A])
    g.check_support(); g.build_plans()
    g.execute({x: x_array, w: w_array, b: b_array, y: y_array}, workspace)

``docs/design/graph.md`` explains the engines, the fusion rule and its cost model.
"""

from opendnn import PointwiseMode, PoolingMode, ReduceTensorOp
from opendnn.core.dtypes import DataType
from opendnn.graph.builder import NormForwardPhase, PaddingMode, ResampleMode
from opendnn.graph.engines import BuildPlanPolicy, HeurMode
from opendnn.graph.graph import Graph
from opendnn.graph.plan import ExecutionPlan
from opendnn.graph.tensor import Tensor

__all__ = [
    "BuildPlanPolicy",
    "DataType",
    "ExecutionPlan",
    "Graph",
    "HeurMode",
    "NormForwardPhase",
    "PaddingMode",
    "PointwiseMode",
    "PoolingMode",
    "ReduceTensorOp",
    "ResampleMode",
    "Tensor",
]
