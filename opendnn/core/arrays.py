"""Array interop: torch tensors, NumPy arrays and anything with ``__dlpack__``, all zero-copy.

Inside opendnn every array is *native*: a NumPy array (CPU) or a torch tensor (CPU or CUDA).
A descriptor is *bound* to a caller's array by taking a strided view of the descriptor's dims and
strides starting at the array's first element, after checking that the view stays inside the
memory the array owns (so a descriptor may address a sub-region of a larger buffer, never past it).

bfloat16 on the NumPy side is ml_dtypes' bfloat16 when ml_dtypes is installed (NumPy arrays of that
dtype are accepted as input either way), else its uint16 bit pattern; the NumPy backend works on the
bit pattern of both (``bf16_to_float32`` / ``float32_to_bf16`` convert, rounding to nearest even).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status, require

CPU = "cpu"
_DLPACK_CPU, _DLPACK_CUDA = 1, 2


def is_torch(array: Any) -> bool:
    return _is_torch_type(array.__class__)


@functools.lru_cache(maxsize=64)  # asked for every array of every call, of a handful of types
def _is_torch_type(kind: type) -> bool:
    return kind.__module__.startswith("torch") and hasattr(kind, "untyped_storage")


def as_native(array: Any, name: str = "array") -> Any:
    """The caller's array as a NumPy array or torch tensor sharing its memory (a tensor that
    requires grad is read detached: opendnn computes without autograd, as cuDNN does)."""
    if isinstance(array, np.ndarray):
        return array
    if is_torch(array):
        return array.detach() if array.requires_grad else array
    if hasattr(array, "__dlpack__"):
        device_type, _ = array.__dlpack_device__()
        if device_type == _DLPACK_CPU:
            try:
                return np.from_dlpack(array)
            except (TypeError, BufferError, RuntimeError):
                pass  # a dtype NumPy lacks (bfloat16): torch reads it
        import torch

        return torch.from_dlpack(array)
    raise BadParam(
        f"{name} of type {type(array).__name__} is not a NumPy array, a torch tensor or an object with __dlpack__"
    )


def device_of(native: Any) -> str:
    """ "cpu" or "cuda:N"."""
    return CPU if isinstance(native, np.ndarray) else _tensor_device(native)


def _tensor_device(tensor: Any) -> str:
    # asked for every tensor: the flags and the index cost less than making its torch.device
    if tensor.is_cpu:
        return CPU
    if tensor.is_cuda:
        return _cuda_name(tensor.get_device())
    return _device_name(tensor.device)


@functools.lru_cache(maxsize=64)  # a table of the device names, read for every CUDA tensor of every call
def _cuda_name(index: int) -> str:
    return f"cuda:{index}"


@functools.lru_cache(maxsize=64)  # a table of the few devices, read for every tensor of every call
def _device_name(device: Any) -> str:
    return CPU if device.type == "cpu" else f"{device.type}:{device.index or 0}"


def dtype_of(native: Any) -> DataType:
    dtype = native.dtype
    try:
        return _NATIVE_DTYPES[dtype]  # asked for every array of every call, of a handful of dtypes
    except KeyError:
        _NATIVE_DTYPES[dtype] = known = DataType.of(dtype)
        return known
    except TypeError:  # unhashable
        return DataType.of(dtype)


_NATIVE_DTYPES: dict[Any, DataType] = {}  # NumPy and torch dtype -> DataType, learnt as they come


def descriptor_of(native: Any, name: str = "array") -> TensorDescriptor:
    """The descriptor of an array's own dims and strides (a 0-d array becomes dims (1,))."""
    if isinstance(native, np.ndarray):
        strides = tuple(s // native.itemsize for s in native.strides)
    else:
        strides = native.stride()
    return _descriptor_of(native.dtype, tuple(native.shape), strides, name)


@functools.lru_cache(maxsize=4096)  # wrap describes each array of the calls without plans, every call
def _descriptor_of(native_dtype: Any, dims: tuple[int, ...], strides: tuple[int, ...], name: str) -> TensorDescriptor:
    # memoized: every call describes its arrays, and their dtypes, shapes and strides repeat; the
    # result is a frozen value, so one instance may serve every caller (errors are not cached)
    try:
        dtype = DataType.of(native_dtype)
    except BadParam:  # named after the caller's array, which DataType cannot know
        raise BadParam(f"{name}.dtype={native_dtype} must be one of {[t.value for t in DataType]}") from None
    for k, s in enumerate(strides):
        require(s >= 0, f"{name}.strides[{k}]={s} must be at least 0 (negative strides are not supported)")
    require(all(d >= 1 for d in dims), f"{name}.shape={dims} must have no empty dimension")
    return TensorDescriptor(dtype, dims or (1,), strides or (1,))


def buffer_elements(native: Any) -> int:
    """Elements addressable from the array's first element to the end of the memory it views."""
    if isinstance(native, np.ndarray):
        owner = memory_owner(native)
        if not (owner.flags.c_contiguous or owner.flags.f_contiguous):
            return descriptor_of(native).extent
        end = owner.__array_interface__["data"][0] + owner.nbytes
        return (end - native.__array_interface__["data"][0]) // native.itemsize
    return native.untyped_storage().nbytes() // native.element_size() - native.storage_offset()


def memory_owner(native: np.ndarray) -> np.ndarray:
    """The NumPy array at the end of ``native``'s chain of bases: the array whose memory it views
    (through the array-interface holder between an ``as_strided`` view and its array)."""
    owner = native
    while True:
        base = owner.base
        if not isinstance(base, np.ndarray) and hasattr(base, "__array_interface__"):
            base = getattr(base, "base", None)
        if not isinstance(base, np.ndarray):
            return owner
        owner = base


@dataclass(frozen=True, init=False)
class Bound:
    """A descriptor bound to memory: ``view`` is a native array with exactly its dims and strides;
    ``output`` marks a caller's array the call writes (``check_overlaps`` guards it)."""

    name: str
    desc: TensorDescriptor
    view: Any
    device: str
    output: bool

    def __init__(self, name: str, desc: TensorDescriptor, view: Any, device: str, output: bool = False) -> None:
        # the fields straight into the instance dict: a frozen dataclass's generated __init__ sets
        # them one object.__setattr__ at a time, twice the cost, and every call makes several Bounds
        fields = self.__dict__
        fields["name"], fields["desc"], fields["view"], fields["device"] = name, desc, view, device
        fields["output"] = output


def bind(name: str, desc: TensorDescriptor | None, array: Any, *, output: bool = False) -> Bound:
    """Bind ``desc`` to ``array``'s memory, refusing a wrong dtype, an output whose elements overlap
    each other or that is a read-only NumPy array, or an extent past the buffer. ``array`` may be a
    Bound (opendnn's own layers hand theirs on): bound to an equal descriptor already, its view was
    checked then and is taken as it is; else its view is bound like any array. A tensor that
    requires grad is bound detached (the calls compute without autograd, as cuDNN's). Whether an
    output overlaps another tensor of the call is ``check_overlaps``'s question, asked by the dispatch.

    Raises:
        BadParam: naming ``name`` and the rule it broke.
    """
    # the messages are built only on failure: bind runs on every call, and formatting costs more than the checks
    if not isinstance(desc, TensorDescriptor):
        raise BadParam(f"{name}_desc={desc!r} must be a TensorDescriptor")
    if type(array) is Bound:
        if array.desc is desc or array.desc == desc:
            if output and not desc.is_non_overlapping:
                raise BadParam(f"{name}_desc={desc} has overlapping elements and cannot be written")
            return Bound(name, desc, array.view, array.device, output)
        array = array.view
    torch_tensor = _is_torch_type(array.__class__)
    if torch_tensor and array.requires_grad:
        array = array.detach()
    native = array if torch_tensor else as_native(array, name)
    actual = dtype_of(native)
    if actual is not desc.dtype:
        raise BadParam(f"{name}.dtype={actual.value} must equal {name}_desc.dtype={desc.dtype.value}")
    if output and isinstance(native, np.ndarray) and not native.flags.writeable:
        raise BadParam(f"{name} is a read-only NumPy array (flags.writeable is False) and the call writes it")
    if torch_tensor and native.shape == desc.dims and native.stride() == desc.strides:
        # the tensor is its own view: it fits its buffer, and it needs no re-striding
        if output and not desc.is_non_overlapping:
            raise BadParam(f"{name}_desc={desc} has overlapping elements and cannot be written")
        return Bound(name, desc, native, _tensor_device(native), output)
    available = buffer_elements(native)
    if desc.extent > available:
        raise BadParam(
            f"{name}_desc reaches {desc.extent} elements but {name} holds {available} from its start",
            Status.BAD_PARAM_OUT_OF_BOUND,
        )
    if output and not desc.is_non_overlapping:
        raise BadParam(f"{name}_desc={desc} has overlapping elements and cannot be written")
    return Bound(name, desc, strided_view(native, desc), device_of(native), output)


def check_overlaps(tensors: Sequence[Bound], in_place: bool | tuple[str, ...] = False) -> None:
    """Refuse a call whose output shares memory with another of its tensors: on a GPU, a kernel
    writing one while others read or write the other races with them.

    An output may be *exactly* an input (same address, dtype, dims and strides: each element read
    and written in place) where the operation allows it: ``in_place`` True for any input, or the
    names of the inputs it may be. A partial overlap (a shifted view of the same buffer) is always
    refused; so are two outputs sharing memory.

    Cost: per output and other tensor, the test of their address intervals (the common case stops
    there); only intervals that intersect go on to the exact question (``_shares_memory``).

    Raises:
        BadParam: naming both tensors.
    """
    for out in tensors:
        if not out.output:
            continue
        view = out.view
        if view.__class__ is np.ndarray:  # a NumPy array's address costs microseconds: NumPy compares the bounds
            for other in tensors:
                if other is not out and (
                    other.view.__class__ is not np.ndarray or np.may_share_memory(view, other.view)
                ):
                    _check_pair(out, other, in_place)
            continue
        start = view.data_ptr()
        end = start + out.desc.size_in_bytes
        for other in tensors:  # the address intervals [first byte, last byte + 1) first: disjoint ones pass
            if other is out:
                continue
            other_view = other.view
            if other_view.__class__ is np.ndarray:
                _check_pair(out, other, in_place)
                continue
            other_start = other_view.data_ptr()
            if other_start < end and start < other_start + other.desc.size_in_bytes:
                _check_pair(out, other, in_place)


def _check_pair(out: Bound, other: Bound, in_place: bool | tuple[str, ...]) -> None:
    """check_overlaps for an output and another tensor whose address intervals may meet."""
    alias = _same_elements(out, other)
    if alias and not other.output and (in_place is True or (in_place and other.name in in_place)):
        return
    if alias:
        raise BadParam(
            f"{out.name} and {other.name} are the same memory: this call cannot write {out.name} over {other.name}"
        )
    if _shares_memory(out, other):
        raise BadParam(
            f"{out.name} and {other.name} overlap in memory: a call's output may share no "
            f"element with its other tensors (exact in-place use aside, where the call allows it)"
        )


def share_memory(a: Bound, b: Bound) -> bool:
    """Whether two tensors share a byte: NumPy's bounds test of two NumPy arrays, or their address
    intervals, first (apart: no), then ``_shares_memory``."""
    a_view, b_view = a.view, b.view
    if a_view.__class__ is np.ndarray and b_view.__class__ is np.ndarray:
        if not np.may_share_memory(a_view, b_view):
            return False
    else:
        a_start, b_start = _address(a_view), _address(b_view)
        if not (b_start < a_start + a.desc.size_in_bytes and a_start < b_start + b.desc.size_in_bytes):
            return False
    return _shares_memory(a, b)


def _address(native: Any) -> int:
    if isinstance(native, np.ndarray):
        address: int = native.__array_interface__["data"][0]
        return address
    pointer: int = native.data_ptr()
    return pointer


def _same_elements(a: Bound, b: Bound) -> bool:
    """Whether two tensors are the very same elements: address, dtype, dims and strides."""
    return a.desc == b.desc and _address(a.view) == _address(b.view)


OVERLAP_WORK = 10_000  # steps NumPy's exact overlap solver may take before the answer counts as "may overlap"


def _shares_memory(a: Bound, b: Bound) -> bool:
    """Whether two tensors whose address intervals meet share a byte, decided exactly by NumPy's
    solver on their addresses, dims and strides (no element is read: the views may be device
    memory); True also when deciding would take more than OVERLAP_WORK steps."""
    try:
        return bool(np.shares_memory(_addresses(a), _addresses(b), max_work=OVERLAP_WORK))
    except np.exceptions.TooHardError:
        return True


def _addresses(bound: Bound) -> np.ndarray:
    """A NumPy array over a tensor's addresses (element type: bytes of its itemsize), for
    ``np.shares_memory``: made from an array interface, never read."""
    itemsize = bound.desc.dtype.itemsize
    interface = {
        "data": (_address(bound.view), True),
        "shape": bound.desc.dims,
        "typestr": f"|V{itemsize}",
        "strides": tuple(s * itemsize for s in bound.desc.strides),
        "version": 3,
    }
    return np.asarray(_Interface(interface))


@dataclass(frozen=True)
class _Interface:
    __array_interface__: dict[str, Any]


WORKSPACE_ALIGNMENT = 16  # bytes: workspaces and reserve spaces start at multiples of this


def bind_bytes(name: str, array: Any, needed: int, query: str) -> Bound | None:
    """``array`` (a workspace or reserve space: contiguous, any dtype) as a Bound of bytes, checked
    against the ``needed`` size that ``query`` gives; None when nothing is needed.

    Raises:
        BadParam: the array missing, not contiguous, read-only, too small or misaligned, naming both sizes.
    """
    if needed == 0:
        return None
    if array is None:
        raise BadParam(f"{name}=None but {query} needs {needed} bytes", Status.BAD_PARAM_NULL_POINTER)
    native = as_native(array, name)
    if isinstance(native, np.ndarray):
        contiguous, address, nbytes = native.flags.c_contiguous, native.__array_interface__["data"][0], native.nbytes
    else:
        contiguous, address = native.is_contiguous(), native.data_ptr()
        nbytes = native.numel() * native.element_size()
    if not contiguous:  # (the messages are formatted only on failure: this runs for every call)
        raise BadParam(f"{name} of shape {tuple(native.shape)} must be contiguous")
    if isinstance(native, np.ndarray) and not native.flags.writeable:
        raise BadParam(f"{name} is a read-only NumPy array (flags.writeable is False): scratch memory must be writable")
    if nbytes < needed:
        raise BadParam(
            f"{name} holds {nbytes} bytes but {query} needs {needed} bytes", Status.BAD_PARAM_SIZE_INSUFFICIENT
        )
    if address % WORKSPACE_ALIGNMENT:
        raise BadParam(
            f"{name} address {address:#x} must be a multiple of {WORKSPACE_ALIGNMENT} bytes",
            Status.BAD_PARAM_MISALIGNED_POINTER,
        )
    if isinstance(native, np.ndarray):
        view = native.reshape(-1).view(np.uint8)
    else:
        import torch

        view = native if native.dtype == torch.uint8 and native.dim() == 1 else native.reshape(-1).view(torch.uint8)
    return Bound(name, bytes_descriptor(nbytes), view, device_of(native))


@functools.lru_cache(maxsize=256)  # a frozen value, built for every call that takes a workspace
def bytes_descriptor(count: int) -> TensorDescriptor:
    """The descriptor of ``count`` contiguous bytes (a workspace or reserve space)."""
    return packed_descriptor(DataType.UINT8, (count,), (0,))


def scratch_bytes(like: Bound, count: int, name: str = "workspace") -> Bound | None:
    """``count`` bytes of new scratch memory (``allocate_bytes``) bound as bytes, None for 0 bytes:
    what bind_bytes checks holds by construction (contiguous, of ``count`` bytes, and aligned: both
    allocators align to more than WORKSPACE_ALIGNMENT)."""
    native = allocate_bytes(like, count)
    return None if native is None else Bound(name, bytes_descriptor(count), native, like.device)


def allocate_bytes(like: Bound, count: int) -> Any:
    """``count`` bytes of scratch memory of ``like``'s kind, on its device (None for 0 bytes)."""
    if count == 0:
        return None
    if isinstance(like.view, np.ndarray):
        return np.empty(count, np.uint8)
    import torch

    return torch.empty(count, dtype=torch.uint8, device=like.view.device)


def torch_view(bound: Bound) -> Any:
    """The bound view as a torch tensor sharing its memory (a NumPy array is wrapped, bfloat16 bits
    reinterpreted): what the Triton kernels take, also on the CPU through the interpreter.

    A NumPy array becomes a view of a tensor over all of its owner's memory (``memory_owner``), so the
    views of one buffer are views of one storage, as torch's own are: Triton's interpreter copies each
    storage to the host and back once per address, and a storage of one view's extent cannot hold
    another view of the same address that reaches further (``x[:4]`` and ``x[::2]``)."""
    view = bound.view
    if not isinstance(view, np.ndarray):
        return view
    import torch

    bits = bound.desc.dtype is DataType.BFLOAT16  # uint16 bits or ml_dtypes' bfloat16: torch reads the bits
    memory, offset = _owner_memory(view, np.dtype(np.uint16) if bits else view.dtype)
    tensor = torch.from_numpy(memory)
    if offset is not None:
        tensor = tensor.as_strided(view.shape, [s // memory.itemsize for s in view.strides], offset)
    return tensor.view(torch.bfloat16) if bits else tensor


def _owner_memory(view: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, int | None]:
    """``view``'s owner's memory as a flat array of ``dtype`` (from its first byte at ``view``'s
    alignment) and the offset of ``view``'s first element in it; ``view`` itself (seen as
    ``dtype``) and None where the owner is not one dense block."""
    owner = memory_owner(view)
    if not (owner.flags.c_contiguous or owner.flags.f_contiguous):
        return view.view(dtype), None
    start = _address(view) - _address(owner)
    flat = owner.reshape(-1, order="A").view(np.uint8)[start % dtype.itemsize :]
    return flat[: flat.size - flat.size % dtype.itemsize].view(dtype), start // dtype.itemsize


def strided_view(native: Any, desc: TensorDescriptor) -> Any:
    """A view of ``desc.dims`` and ``desc.strides`` starting at ``native``'s first element."""
    if isinstance(native, np.ndarray):
        itemsize = native.itemsize
        return np.lib.stride_tricks.as_strided(native, desc.dims, tuple(s * itemsize for s in desc.strides))
    return native.as_strided(desc.dims, desc.strides, native.storage_offset())


def redescribed(bound: Bound, desc: TensorDescriptor) -> Bound:
    """``bound``'s memory read as ``desc`` (dims and strides from its first element)."""
    if desc == bound.desc:
        return bound
    return Bound(bound.name, desc, strided_view(bound.view, desc), bound.device)


def array_key(array: Any) -> tuple[Any, ...] | None:
    """What a call's plan assumes of a caller's array: kind, dtype, shape, strides and device (the
    last); None for an array of another kind (a DLPack one)."""
    kind = array.__class__
    if kind is np.ndarray:
        return kind, array.dtype, array.shape, array.strides, CPU
    if _is_torch_type(kind):
        return kind, array.dtype, array.shape, array.stride(), _tensor_device(array)
    return None


def keyed_bound(name: str, desc: TensorDescriptor, array: Any, device: str) -> Bound:
    """``array`` bound to ``desc``, the descriptor of its own dims and strides that its ``array_key``
    proves (``wrap`` without the descriptor's lookup): the array is its own view (0-d seen as (1,))."""
    if array.__class__ is np.ndarray:
        return Bound(name, desc, array if array.ndim else array.reshape(1), device)
    if array.requires_grad:
        array = array.detach()
    return Bound(name, desc, array if array.dim() else array.reshape(1), device)


def wrap(name: str, array: Any) -> Bound:
    """Bind an array to the descriptor of its own dims and strides (the Pythonic API's way in)."""
    if _is_torch_type(array.__class__) and array.dim() > 0:  # a tensor (not 0-d) is its own view: no new one needed
        if array.requires_grad:
            array = array.detach()
        desc = _descriptor_of(array.dtype, tuple(array.shape), array.stride(), name)
        return Bound(name, desc, array, _tensor_device(array))
    native = as_native(array, name)
    desc = descriptor_of(native, name)
    own = native.ndim > 0  # an array of its own dims and strides is its view (a DLPack one too)
    return Bound(name, desc, native if own else strided_view(native, desc), device_of(native))


def empty_like(
    bound: Bound,
    dtype: DataType | None = None,
    dims: tuple[int, ...] | None = None,
    order: tuple[int, ...] | None = None,
) -> Bound:
    """A new packed output on ``bound``'s device: ``dims`` (default bound's) laid out in ``order``
    (memory order of the dims, outermost first; default bound's own order)."""
    dtype = dtype or bound.desc.dtype
    dims = dims or bound.desc.dims
    desc = packed_like(bound.desc, dtype, dims) if order is None else packed_descriptor(dtype, dims, order)
    return allocate(bound, desc)


def packed_like(desc: TensorDescriptor, dtype: DataType, dims: tuple[int, ...]) -> TensorDescriptor:
    """The packed descriptor of ``dims`` in ``dtype`` laid out in ``desc``'s memory order."""
    return packed_descriptor(dtype, dims, memory_order(desc.strides[: len(dims)]))


def allocate(like: Bound, desc: TensorDescriptor, name: str | None = None) -> Bound:
    """A new array of ``desc`` (a packed one: no gaps, no overlaps) on ``like``'s device and of its
    kind (NumPy or torch), bound under ``name`` (default: like's name)."""
    native: Any  # a NumPy array or a torch tensor, as like's
    if isinstance(like.view, np.ndarray):
        memory_dims, back, strides = _numpy_layout(desc)
        native = np.empty(memory_dims, desc.dtype.to_numpy()).transpose(back)
        if native.strides != strides:  # a dim of 1 whose stride np.empty sets otherwise: the buffer's view
            buffer = np.empty(desc.extent, native.dtype)  # (a constructor, not as_strided's machinery)
            native = np.ndarray(desc.dims, native.dtype, buffer, strides=strides)
    else:
        import torch

        # allocated with its strides, not as a view of a flat buffer: callers (autograd) may modify
        # the result in place, which torch refuses for views that a custom Function returns
        native = torch.empty_strided(desc.dims, desc.strides, dtype=desc.dtype.to_torch(), device=like.view.device)
    return Bound(name or like.name, desc, native, like.device)


@functools.lru_cache(maxsize=4096)  # per descriptor: every call allocates its outputs
def _numpy_layout(desc: TensorDescriptor) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A packed descriptor's dims in memory order (outermost first), the transpose that takes an array
    of those dims back to desc's order, and desc's strides in bytes: ``np.empty`` of the dims, so
    transposed, is desc's array (0.3 us, against 0.6 for a flat buffer viewed with the strides)."""
    order = memory_order(desc.strides)
    itemsize = desc.dtype.itemsize
    return (
        tuple(desc.dims[k] for k in order),
        tuple(order.index(k) for k in range(len(order))),
        tuple(s * itemsize for s in desc.strides),
    )


@functools.lru_cache(maxsize=1024)  # asked for each new output of the calls without plans, every call
def memory_order(strides: tuple[int, ...]) -> tuple[int, ...]:
    """The dims in memory order, outermost (largest stride) first, ties in dim order."""
    return tuple(sorted(range(len(strides)), key=lambda k: -strides[k]))


@functools.lru_cache(maxsize=4096)  # the new outputs of the calls without plans, of shapes that repeat
def packed_descriptor(dtype: DataType, dims: tuple[int, ...], order: tuple[int, ...]) -> TensorDescriptor:
    """The packed descriptor of ``dims`` laid out in ``order`` (the dims in memory order, outermost first)."""
    return TensorDescriptor(dtype, dims, strides_for_order(dims, order))


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) to float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bit patterns (uint16), rounding to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def constant_like(bound: Bound, value: float) -> Bound:
    """A one-element tensor holding ``value`` in ``bound``'s dtype and device, broadcast (all
    strides 0) to ``bound``'s dims."""
    dtype = bound.desc.dtype
    native: Any  # a NumPy array or a torch tensor, as bound's
    if isinstance(bound.view, np.ndarray):
        native = (
            float32_to_bf16(np.array([value], np.float32)).view(dtype.to_numpy())
            if dtype is DataType.BFLOAT16
            else np.array([value], dtype.to_numpy())
        )
    else:
        import torch

        native = torch.full((1,), value, dtype=dtype.to_torch(), device=bound.view.device)
    desc = TensorDescriptor(dtype, bound.desc.dims, (0,) * bound.desc.ndim)
    return Bound("value", desc, strided_view(native, desc), bound.device)


def index_along(bound: Bound, axis: int) -> Bound:
    """0, 1, 2, ... along ``axis`` of ``bound``'s dims (int64, other strides 0): GEN_INDEX's input."""
    count = bound.desc.dims[axis]
    native: Any  # a NumPy array or a torch tensor, as bound's
    if isinstance(bound.view, np.ndarray):
        native = np.arange(count, dtype=np.int64)
    else:
        import torch

        native = torch.arange(count, dtype=torch.int64, device=bound.view.device)
    strides = tuple(1 if k == axis else 0 for k in range(bound.desc.ndim))
    desc = TensorDescriptor(DataType.INT64, bound.desc.dims, strides)
    return Bound("index", desc, strided_view(native, desc), bound.device)


def broadcast_to(bound: Bound, dims: tuple[int, ...]) -> Bound:
    """``bound`` seen with NumPy's broadcasting as ``dims``: leading dims added, size-1 dims
    stretched with stride 0 (no copy)."""
    if bound.desc.dims == dims:
        return bound
    view = bound.view
    view = view.reshape((1,) * (len(dims) - view.ndim) + tuple(view.shape)) if view.ndim < len(dims) else view
    if isinstance(view, np.ndarray):
        view = np.broadcast_to(view, dims)
    else:
        view = view.expand(dims)
    desc = descriptor_of(view, bound.name)
    return Bound(bound.name, desc, view, bound.device)
