"""Per-call-signature plans: a functional call checked once per signature, then one lookup.

A call's signature is what varies from call to call and is cheap to read: per array its kind,
dtype, shape, strides and device (``arrays.array_key``), and the scalar arguments. Every call of one
signature builds the same descriptors and problem and passes the same checks, so the first call of
a signature takes the full path and keeps a ``Plan`` (the validated problem, the outputs'
descriptors, and the backend module that ``dispatch`` chose and found willing); a repeated call
binds its arrays to the planned descriptors (``arrays.keyed_bound``), allocates its outputs and runs
the backend (``dispatch.execute``).

Plans live on the handle (``Handle.plans``, at most LIMIT): the handle's device, backend and
policies are part of every plan it holds, and a destroyed handle drops them. A plan holds
descriptors and values, never a caller's array; neither does a key.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opendnn.core.arrays import array_key
from opendnn.core.default_handle import shared_handle
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.handle import Handle

LIMIT = 1024  # plans per handle; past it they are all dropped (a network makes a few hundred distinct calls)

_PLAIN = frozenset({int, float, bool, str, type(None)})


@dataclass(frozen=True)
class Plan:
    """What every call of one signature computes alike: the ``operation`` (``dispatch.OPERATIONS``)
    and its validated ``problem``, the ``outputs``' descriptors, the backend module that runs it, and
    the family's own planned values (``extra``)."""

    operation: str
    problem: Any
    outputs: tuple[TensorDescriptor, ...]
    implementation: Any
    extra: Any = None


def signature(call: str, arrays: Sequence[Any], scalars: Sequence[Any]) -> tuple[Any, ...] | None:
    """The key of a call named ``call`` of ``arrays`` (None where one is absent; the first is given)
    and ``scalars``; None when an argument cannot be keyed (a DLPack array; a scalar other than a
    plain Python value, an enum member or a tuple or list of them, such as an ``np.float64``), and
    such a call takes the full path every time."""
    keys: list[Any] = [call]
    for array in arrays:
        key = None if array is None else array_key(array)
        if key is None and array is not None:
            return None
        keys.append(key)
    for scalar in scalars:
        if scalar.__class__ in _PLAIN or isinstance(scalar, enum.Enum):  # (_plain, inline: a call has ten)
            keys.append(scalar)
        elif scalar.__class__ in (tuple, list) and all(_plain(item) for item in scalar):
            keys.append(tuple(scalar))  # the calls take a list as the tuple of its items
        else:
            return None
    return tuple(keys)


def _plain(value: Any) -> bool:
    return value.__class__ in _PLAIN or isinstance(value, enum.Enum)


def lookup(handle: Handle | None, key: tuple[Any, ...]) -> tuple[Handle, Plan | None]:
    """The call's handle (the given one, else the shared one of its first array's device) and its
    plan for ``key``, or None on the first call of the signature."""
    if handle is None:
        handle = shared_handle(key[1][-1])
    return handle, handle.plans.get(key)


def keep(handle: Handle, key: tuple[Any, ...] | None, plan: Plan) -> None:
    """Keep ``plan`` on the handle for the calls of ``key`` (nothing for an unkeyed call)."""
    if key is None:
        return
    if len(handle.plans) >= LIMIT:
        handle.plans.clear()
    handle.plans[key] = plan
