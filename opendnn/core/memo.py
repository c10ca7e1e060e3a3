"""``memoized``: the per-call builders (problems, descriptors) computed once per distinct arguments."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from opendnn.core.errors import OpenDnnError

T = TypeVar("T")


def memoized(function: Callable[..., T], maxsize: int = 1024, lists_as_tuples: bool = False) -> Callable[..., T]:
    """``function`` memoized on hashable arguments; unhashable ones (lists) call it directly.

    Only for pure functions of frozen values (descriptors, enums, numbers, tuples) that return
    frozen values: the same arguments repeat from call to call, and a hit costs a microsecond where
    the rules cost tens. Errors are not cached (they raise every time).

    ``lists_as_tuples``: for a function that reads a list as the tuple of its items (torch's int[]
    argument forms, which come as lists on every call), positional lists are looked up as tuples; an
    argument the function refuses is refused as given, so that its error names the list.
    """
    memo = functools.lru_cache(maxsize=maxsize, typed=True)(function)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return memo(*args, **kwargs)
        except TypeError:
            if lists_as_tuples:
                try:
                    return memo(*[tuple(a) if a.__class__ is list else a for a in args], **kwargs)
                except (TypeError, OpenDnnError):
                    return function(*args, **kwargs)
            try:
                hash((args, tuple(kwargs.items())))
            except TypeError:
                return function(*args, **kwargs)
            raise

    return call


def cached_hash(self: Any) -> int:
    """``__hash__ = cached_hash`` in a frozen dataclass: the fields' hash, computed once per instance.

    Problems key the caches of every call (plans, launches, refusals), and the generated hash
    rehashes every field (enums hash in Python) on each lookup; the fields never change.
    """
    try:
        return self.__dict__["_hash"]  # type: ignore[no-any-return]
    except KeyError:
        value = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
        self.__dict__["_hash"] = value  # frozen: object.__setattr__ is refused, the instance dict is not
        return value


@functools.lru_cache(maxsize=4096)
def canonical(value: T) -> T:
    """The first of the equal frozen values seen, ``value`` itself the first time: a problem that
    equal calls build twice (a workspace query, then the call, with alpha and beta passed) becomes one
    object, so that the caches it keys (refusal, workspace, plan) find it by identity instead of
    comparing every field on each call."""
    return value
