"""cuDNN's status codes and the exceptions that carry them.

Every error names the parameter, the value it got and the rule it broke, e.g.
``BadParam: x_desc.dims[1]=3 must equal y_desc.dims[1]=4``.
"""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """cuDNN 9's status codes: the thousands digit is the category."""

    SUCCESS = 0
    NOT_INITIALIZED = 1001
    BAD_PARAM = 2000
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    BAD_PARAM_OUT_OF_BOUND = 2005
    BAD_PARAM_SIZE_INSUFFICIENT = 2006
    BAD_PARAM_STREAM_MISMATCH = 2007
    BAD_PARAM_SHAPE_MISMATCH = 2008
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_SHAPE = 3002
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_LAYOUT = 3004
    NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008
    INTERNAL_ERROR = 4000
    INTERNAL_ERROR_COMPILATION_FAILED = 4001
    EXECUTION_FAILED = 5000

    @property
    def category(self) -> Status:
        """The category a sub-kind belongs to (BAD_PARAM_OUT_OF_BOUND -> BAD_PARAM)."""
        return Status(self.value // 1000 * 1000) if self.value >= 2000 else self


class OpenDnnError(Exception):
    """Base of every opendnn error; ``status`` is the cuDNN status it stands for."""

    default_status = Status.INTERNAL_ERROR

    def __init__(self, message: str, status: Status | None = None) -> None:
        self.status = status if status is not None else self.default_status
        if self.status.category is not self.default_status.category:
            raise ValueError(f"status={self.status.name} is not a {type(self).__name__}")
        super().__init__(message)


class BadParam(OpenDnnError, ValueError):
    """A parameter is wrong: a bad value, mismatched shapes, a tensor past its buffer."""

    default_status = Status.BAD_PARAM


class NotSupported(OpenDnnError):
    """The request is valid but no available implementation can run it."""

    default_status = Status.NOT_SUPPORTED


class InternalError(OpenDnnError):
    """A bug in opendnn: please report it."""

    default_status = Status.INTERNAL_ERROR


class ExecutionFailed(OpenDnnError):
    """The device failed while running a kernel."""

    default_status = Status.EXECUTION_FAILED


def require(condition: bool, message: str, status: Status = Status.BAD_PARAM) -> None:
    """Raise BadParam (or the given status's exception) with ``message`` unless ``condition``."""
    if not condition:
        raise (NotSupported if status.category is Status.NOT_SUPPORTED else BadParam)(message, status)
