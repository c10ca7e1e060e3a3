"""Descriptors, dtypes, errors, handles, array interop and logging."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.core.arrays import bf16_to_float32, bind, bind_bytes, float32_to_bf16
from opendnn.core.descriptors import strides_for_order


def test_version_is_cudnn_style_int():
    major, minor, patch = (int(p) for p in od.__version__.split("."))
    assert od.version() == major * 10000 + minor * 100 + patch


def test_import_needs_no_torch_or_triton():
    code = "import sys, opendnn; print('torch' in sys.modules, 'triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("FLOAT", np.float32),
        ("DOUBLE", np.float64),
        ("HALF", np.float16),
        ("INT8", np.int8),
        ("UINT8", np.uint8),
        ("INT32", np.int32),
        ("INT64", np.int64),
        ("BOOLEAN", np.bool_),
    ],
)
def test_datatype_maps_to_numpy_and_torch(name, dtype):
    member = od.DataType[name]
    assert member.to_numpy() == np.dtype(dtype)
    assert od.DataType.of(dtype) is member
    assert od.DataType.of(member.to_torch()) is member
    assert member.itemsize == np.dtype(dtype).itemsize


def test_bfloat16_maps_to_torch_and_rounds_to_nearest_even():
    assert od.DataType.of(torch.bfloat16) is od.DataType.BFLOAT16
    values = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    ours = bf16_to_float32(float32_to_bf16(values))
    theirs = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_descriptor_packed_strides_and_size():
    desc = od.TensorDescriptor(od.DataType.HALF, (2, 3, 4))
    assert desc.strides == (12, 4, 1) and desc.size_in_bytes == 48 and desc.is_packed


def test_descriptor_from_format_nhwc_and_3d():
    nhwc = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "float32", 2, 3, 4, 5)
    assert nhwc.dims == (2, 3, 4, 5) and nhwc.strides == (60, 1, 15, 3)
    ndhwc = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "float32", 2, 3, 4, 5, 6)
    assert ndhwc.strides == (360, 1, 90, 18, 3)
    assert od.TensorDescriptor.from_format(od.TensorFormat.NCHW, "float32", 2, 3, 4, 5).is_packed


@pytest.mark.parametrize(
    "dims, strides, message",
    [
        ((), None, "len(dims)=0 must be between 1 and 8"),
        ((1,) * 9, None, "len(dims)=9 must be between 1 and 8"),
        ((2, 0), None, "dims[1]=0 must be at least 1"),
        ((2, 3), (3,), "len(strides)=1 must equal len(dims)=2"),
        ((2, 3), (3, -1), "strides[1]=-1 must be at least 0"),
        (
            (2**31, 2**30, 2),
            None,
            "dims=[2147483648, 1073741824, 2] with strides=[2147483648, 2, 1] reach 4611686018427387904 elements of "
            "FLOAT: more than the 9223372036854775807 bytes a buffer can hold",
        ),
        ((2, 3), (2**61, 1), "reach 2305843009213693955 elements of FLOAT"),
    ],
)
def test_descriptor_refuses_bad_values(dims, strides, message):
    with pytest.raises(od.BadParam, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        od.TensorDescriptor("float32", dims, strides)


def test_bad_param_carries_status():
    with pytest.raises(od.BadParam) as error:
        od.TensorDescriptor("float32", (0,))
    assert error.value.status is od.Status.BAD_PARAM and error.value.status.category is od.Status.BAD_PARAM
    assert od.Status.NOT_SUPPORTED_LAYOUT.category is od.Status.NOT_SUPPORTED


def test_descriptor_may_address_a_subregion_but_not_past_the_buffer():
    buffer = torch.arange(40, dtype=torch.float32)
    inside = od.TensorDescriptor("float32", (3, 4), (10, 2))  # last element at offset 26
    assert bind("x", inside, buffer[5:]).view[2, 3].item() == 5 + 26
    with pytest.raises(od.BadParam, match="x_desc reaches 27 elements but x holds 10 from its start"):
        bind("x", inside, buffer[30:])
    numpy_buffer = np.arange(40, dtype=np.float32)
    assert bind("x", inside, numpy_buffer[5:]).view[2, 3] == 5 + 26
    with pytest.raises(od.BadParam, match="holds 10 from its start"):
        bind("x", inside, numpy_buffer[30:])


def test_bind_refuses_dtype_mismatch_and_overlapping_outputs():
    with pytest.raises(od.BadParam, match="x.dtype=float64 must equal x_desc.dtype=float32"):
        bind("x", od.TensorDescriptor("float32", (4,)), np.zeros(4))
    with pytest.raises(od.BadParam, match="has overlapping elements"):
        bind("y", od.TensorDescriptor("float32", (4, 4), (1, 1)), np.ones(16, np.float32), output=True)


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_read_only_numpy_outputs_and_workspaces_are_refused_unwritten(backend):
    handle = od.create("cpu", backend=backend)
    desc = od.TensorDescriptor("float32", (2, 3))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    frozen = bytes(np.full(6, np.nan, np.float32).tobytes())
    y = np.frombuffer(frozen, np.float32)  # a view of an immutable bytes object
    calls = {
        "y": lambda: od.activation_forward(handle, od.ActivationDescriptor("relu"), 1.0, desc, x, 0.0, desc, y),
        "c": lambda: od.add_tensor(handle, 1.0, desc, x, 0.0, desc, y),
    }
    for name, call in calls.items():
        with pytest.raises(od.BadParam, match=f"^{name} is a read-only NumPy array"):
            call()
    assert frozen == np.full(6, np.nan, np.float32).tobytes()
    workspace = np.zeros(64, np.uint8)
    workspace.flags.writeable = False
    with pytest.raises(od.BadParam, match="workspace is a read-only NumPy array"):
        bind_bytes("workspace", workspace, 64, "the size query")


def test_handle_options_and_lifecycle():
    with od.create("cpu", math_type=od.MathType.TENSOR_OP, deterministic=False, workspace_limit=1024) as handle:
        assert (handle.device, handle.backend, handle.math_type) == ("cpu", "numpy", od.MathType.TENSOR_OP)
        assert handle.get_stream() is None and handle.workspace_limit == 1024 and not handle.deterministic
    with pytest.raises(od.BadParam, match="handle was destroyed"):
        od.scale_tensor(handle, od.TensorDescriptor("float32", (2,)), np.ones(2, np.float32), 2.0)
    with pytest.raises(od.BadParam, match="backend='cuda' must be one of"):
        od.create("cpu", backend="cuda")
    with pytest.raises(od.BadParam, match="device='tpu' must be"):
        od.create("tpu")
    with pytest.raises(od.BadParam, match="needs a CUDA handle"):
        od.create("cpu").set_stream(1234)


@pytest.mark.parametrize("fast_math", [True, False])
def test_fast_math_is_the_handles_and_reaches_every_pointwise_and_matmul_problem(monkeypatch, fast_math):
    from opendnn.core import dispatch as dispatch_module

    seen = []
    run = dispatch_module.dispatch
    monkeypatch.setattr(
        dispatch_module, "dispatch", lambda h, op, problem, *t: seen.append(problem) or run(h, op, problem, *t)
    )
    for module in ("pointwise.functional", "pointwise.activation_api", "pointwise.tensor_ops_api", "matmul.functional"):
        monkeypatch.setattr(f"opendnn.families.{module}.dispatch", dispatch_module.dispatch)
    handle = od.create("cpu", fast_math=fast_math)
    assert handle.fast_math is fast_math and f"fast_math={fast_math}" in repr(handle)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    F.gelu(x, handle=handle)
    F.matmul(x, x.T.copy(), activation="gelu", handle=handle)
    desc = od.TensorDescriptor("float32", (3, 4))
    od.activation_forward(handle, od.ActivationDescriptor("tanh"), 1.0, desc, x, 0.0, desc, np.empty_like(x))
    od.op_tensor(
        handle, od.OpTensorDescriptor(od.OpTensorOp.ADD), 1.0, desc, x, 1.0, desc, x, 0.0, desc, np.empty_like(x)
    )
    assert [problem.fast_math for problem in seen] == [fast_math] * 4
    assert od.create("cpu").fast_math  # the default: the approximate forms where they apply


def test_dlpack_arrays_are_used_without_copies():
    class DLPackOnly:  # an array library that speaks DLPack only
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack__(self, **kwargs):
            return self.tensor.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    x = torch.randn(3, 4)
    y = torch.full((3, 4), float("nan"))
    desc = od.TensorDescriptor("float32", (3, 4))
    od.activation_forward(
        od.create("cpu"),
        od.ActivationDescriptor(od.ActivationMode.TANH),
        1.0,
        desc,
        DLPackOnly(x),
        0.0,
        desc,
        DLPackOnly(y),
    )
    torch.testing.assert_close(y, torch.tanh(x))


def test_log_level_3_logs_each_call_with_descriptors(tmp_path):
    log = tmp_path / "opendnn.log"
    code = (
        "import numpy as np, opendnn as od; d = od.TensorDescriptor('float32', (2, 2));"
        "x = np.ones((2, 2), np.float32); od.scale_tensor(od.create('cpu'), d, x, 2.0)"
    )
    env = {"OPENDNN_LOGLEVEL": "3", "OPENDNN_LOGDEST": str(log), "PATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(tmp_path.parent))
    text = log.read_text()
    assert "pointwise backend=numpy device=cpu" in text and "IDENTITY" in text and "dims=(2, 2)" in text


@pytest.mark.parametrize("dims", [(2, 3, 4, 5), (2, 1, 3, 3), (1, 3, 1, 2), (3, 1, 1, 1)])
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (0, 2, 3, 1), (3, 0, 1, 2), (1, 3, 0, 2)])
@pytest.mark.parametrize("dtype", [od.DataType.FLOAT, od.DataType.DOUBLE, od.DataType.HALF])
def test_allocate_gives_numpy_arrays_exactly_their_packed_descriptors_strides(dims, order, dtype):
    # dims of 1 tie their strides with a neighbour's, where np.empty of the dims in memory order
    # strides them otherwise than the descriptor
    from opendnn.core.arrays import Bound, allocate

    like = Bound("x", od.TensorDescriptor(dtype, (1,)), np.zeros(1, dtype.to_numpy()), "cpu")
    desc = od.TensorDescriptor(dtype, dims, strides_for_order(dims, order))
    out = allocate(like, desc, "y")
    assert out.name == "y" and out.view.dtype == dtype.to_numpy() and out.view.shape == dims
    assert tuple(s // dtype.itemsize for s in out.view.strides) == desc.strides
    out.view[...] = np.arange(math.prod(dims)).reshape(dims)  # every element its own place
    assert len(np.unique(out.view)) == math.prod(dims)
